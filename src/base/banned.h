/* banned.h - string functions that invite overflows, made compile errors.
 * Use snprintf, memcpy with checked lengths, or emlio_buf instead.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_BANNED_H
#define EMLIO_BANNED_H

#define EMLIO_BANNED(func) sorry_##func##_is_banned_in_emlio

#undef strcpy
#define strcpy(x, y) EMLIO_BANNED(strcpy)
#undef strcat
#define strcat(x, y) EMLIO_BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) EMLIO_BANNED(strncpy)
#undef sprintf
#define sprintf(...) EMLIO_BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) EMLIO_BANNED(vsprintf)
#undef strtok
#define strtok(x, y) EMLIO_BANNED(strtok)
#undef gmtime
#define gmtime(t) EMLIO_BANNED(gmtime)
#undef localtime
#define localtime(t) EMLIO_BANNED(localtime)

#endif /* EMLIO_BANNED_H */
