/* test_workpool.c - the threads of the transform stage.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "workpool.h"

typedef struct unit {
    emlio__work_t work; /* first: the pool hands this back */
    atomic_int *done;
    int *ran_with_nice;
    void **state_seen;
} unit_t;

static atomic_int s_states;

static void *
s_state_new(void)
{
    atomic_fetch_add(&s_states, 1);
    return malloc(1);
}

static void
s_run(emlio__work_t *work, void *state)
{
    unit_t *u = (unit_t *)work;
    *u->state_seen = state;
    errno = 0;
    *u->ran_with_nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    atomic_fetch_add(u->done, 1);
}

static void
test_workpool_runs_every_unit_at_lower_priority(void **state)
{
    (void)state;

    enum { N = 2000 };

    static unit_t units[N];
    static int nice_of[N];
    static void *state_of[N];
    atomic_int done = 0;
    int before = getpriority(PRIO_PROCESS, 0);
    emlio__workpool_config_t cfg = { .threads = 3,
                                     .queue_cap = 16, /* submit must wait */
                                     .nice_delta = 5,
                                     .name = "test",
                                     .state_new = s_state_new,
                                     .state_free = free };
    int err = 0;
    emlio__workpool_t *pool = emlio__workpool_new(&cfg, &err);
    assert_non_null(pool);
    for (int i = 0; i < N; i++) {
        units[i] = (unit_t){ { s_run }, &done, &nice_of[i], &state_of[i] };
        assert_int_equal(emlio__workpool_submit(pool, &units[i].work), 0);
    }
    emlio__workpool_destroy(&pool); /* runs what is queued first */
    assert_null(pool);
    assert_int_equal(atomic_load(&done), N);
    assert_int_equal(atomic_load(&s_states), 3);
    for (int i = 0; i < N; i++) {
        assert_non_null(state_of[i]);
        assert_int_equal(nice_of[i], before + 5 > 19 ? 19 : before + 5);
    }
    /* The submitting thread keeps its priority. */
    assert_int_equal(getpriority(PRIO_PROCESS, 0), before);
    cfg.threads = 0;
    assert_null(emlio__workpool_new(&cfg, &err));
    assert_int_equal(err, EMLIO_EINVAL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workpool_runs_every_unit_at_lower_priority),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
