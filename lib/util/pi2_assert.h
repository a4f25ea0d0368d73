/* Assertions that say what broke. PI2_ASSERT(cond, fmt, ...) logs
 * "file:line: assertion `cond' failed: message" at the error level and aborts,
 * in every build: for invariants whose breach would otherwise corrupt memory
 * or output without a word. PI2_DEBUG_ASSERT is the same where PI2_DEBUG_ASSERTS
 * is defined (make asan) and nothing at all otherwise, its condition not even
 * evaluated: for bounds on hot paths that the release build does not pay for.
 *
 * Errors: these are for the program's own mistakes. Bad input (a file, a
 * message, a flag) gets an error message and a non-zero exit instead. */
#ifndef PI2_ASSERT_H
#define PI2_ASSERT_H

_Noreturn void pi2_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define PI2_ASSERT(cond, ...)                                                                                    \
    do {                                                                                                         \
        if (__builtin_expect(!(cond), 0)) pi2_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);             \
    } while (0)

#ifdef PI2_DEBUG_ASSERTS
#define PI2_DEBUG_ASSERT(cond, ...) PI2_ASSERT(cond, __VA_ARGS__)
#else
#define PI2_DEBUG_ASSERT(cond, ...) ((void)sizeof(!(cond))) /* compiled, type-checked, never run */
#endif

#endif
