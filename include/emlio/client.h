#ifndef EMLIO_CLIENT_H
#define EMLIO_CLIENT_H
#endif
