#ifndef EMLIO_SERVER_H
#define EMLIO_SERVER_H
#endif
