/* mkdir -p.
 *
 * Errors: mkdirs returns -1 with errno set (and the directory it could not
 * make in failed). */
#ifndef PI2_UTIL_MKDIRS_H
#define PI2_UTIL_MKDIRS_H

/* Creates dir and the directories above it that are missing (mode 0755).
 * 0, or -1 with errno set and, when failed is not NULL, the directory that
 * could not be made copied there (failed_len bytes). */
int mkdirs(const char *dir, char *failed, unsigned failed_len);

#endif
