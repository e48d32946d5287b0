/*
 * wallclock_shift: an LD_PRELOAD shim that moves ONLY the wall clock of a process.
 *
 * The shift is read once from $DUETIME_TEST_WALLCLOCK_SHIFT_SECONDS (decimal seconds,
 * may be negative or fractional; unset or empty means no shift). A value that does not
 * parse aborts the process, so a typo cannot quietly run a test without skew.
 *
 * Shifted: clock_gettime(CLOCK_REALTIME / CLOCK_REALTIME_COARSE), gettimeofday, time.
 * Untouched: every other clock (CLOCK_MONOTONIC, CLOCK_BOOTTIME, CPU clocks, ...), so
 * sleeps, timed lock and condition waits and asyncio timers keep working (unlike
 * libfaketime, which breaks Python's timed waits).
 *
 * Only calls that go through libc's dynamic symbols are seen (CPython's time.time()
 * calls clock_gettime that way); a direct vDSO or syscall use would bypass the shim.
 *
 * Built by tests/reliability/test_clock_skew.py:  cc -shared -fPIC -o x.so this.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SHIFT_VARIABLE "DUETIME_TEST_WALLCLOCK_SHIFT_SECONDS"
#define NS_PER_S 1000000000LL

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);

static clock_gettime_fn real_clock_gettime;
static gettimeofday_fn real_gettimeofday;
static long long shift_ns;
static int ready;

static void die(const char *message) {
    /* No stdio: this may run before anything is set up. */
    ssize_t ignored = write(2, message, __builtin_strlen(message));
    (void)ignored;
    abort();
}

/* Runs from the constructor, and again (harmlessly, same results) if a clock call
 * comes first from another library's constructor. */
static void setup(void) {
    if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        return;
    }
    clock_gettime_fn clock_fn = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    gettimeofday_fn tod_fn = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
    if (clock_fn == NULL || tod_fn == NULL) {
        die("wallclock_shift: dlsym(RTLD_NEXT) found no clock_gettime/gettimeofday\n");
    }
    long long shift = 0;
    const char *text = getenv(SHIFT_VARIABLE);
    if (text != NULL && *text != '\0') {
        char *end = NULL;
        errno = 0;
        double seconds = strtod(text, &end); /* locale is "C" this early */
        if (errno != 0 || end == text || *end != '\0' || seconds != seconds ||
            seconds > 1e9 || seconds < -1e9) {
            die("wallclock_shift: $" SHIFT_VARIABLE " is not a number of seconds\n");
        }
        double nanos = seconds * (double)NS_PER_S;
        shift = (long long)(nanos < 0 ? nanos - 0.5 : nanos + 0.5);
    }
    __atomic_store_n(&real_clock_gettime, clock_fn, __ATOMIC_RELAXED);
    __atomic_store_n(&real_gettimeofday, tod_fn, __ATOMIC_RELAXED);
    __atomic_store_n(&shift_ns, shift, __ATOMIC_RELAXED);
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void wallclock_shift_init(void) { setup(); }

static void shift_timespec(struct timespec *value) {
    long long total = (long long)value->tv_nsec + shift_ns % NS_PER_S;
    long long seconds = (long long)value->tv_sec + shift_ns / NS_PER_S;
    if (total < 0) {
        total += NS_PER_S;
        seconds -= 1;
    } else if (total >= NS_PER_S) {
        total -= NS_PER_S;
        seconds += 1;
    }
    value->tv_sec = (time_t)seconds;
    value->tv_nsec = (long)total;
}

int clock_gettime(clockid_t clock_id, struct timespec *value) {
    setup();
    int result = real_clock_gettime(clock_id, value);
    /* result 0 means value was written (glibc declares it nonnull, so no NULL test). */
    if (result == 0 && (clock_id == CLOCK_REALTIME || clock_id == CLOCK_REALTIME_COARSE)) {
        shift_timespec(value);
    }
    return result;
}

/* glibc declares the second argument as void * (a struct timezone * is obsolete). */
int gettimeofday(struct timeval *restrict value, void *restrict zone) {
    setup();
    int result = real_gettimeofday(value, zone);
    if (result == 0) {
        struct timespec precise = {value->tv_sec, (long)value->tv_usec * 1000L};
        shift_timespec(&precise);
        value->tv_sec = precise.tv_sec;
        value->tv_usec = (suseconds_t)(precise.tv_nsec / 1000L);
    }
    return result;
}

/* The real time() returns whole seconds only; it is read through the real
 * clock_gettime so a fractional shift rounds the same way as in the other two. */
time_t time(time_t *location) {
    setup();
    struct timespec now;
    if (real_clock_gettime(CLOCK_REALTIME, &now) != 0) {
        return (time_t)-1;
    }
    shift_timespec(&now);
    if (location != NULL) {
        *location = now.tv_sec;
    }
    return now.tv_sec;
}
