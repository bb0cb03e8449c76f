/* test_placement.c - decode_at=auto: the share of transforms the daemons
 * run, by rate and joules. SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include <math.h>

#include "placement.h"

/* A 110 KB JPEG becomes a 224 x 224 x 3 tensor. */
static emlio__place_input_t
s_input(double client_threads, double server_threads)
{
    emlio__place_input_t in = { 0 };
    in.client = (emlio__place_side_t){ client_threads, 0.002, 3.2 };
    in.server = (emlio__place_side_t){ server_threads, 0.002, 3.2 };
    in.encoded_B = 110000;
    in.tensor_B = 224 * 224 * 3;
    return in;
}

/* Equal costs and power: energy is the same everywhere, so the fastest
 * split wins: the daemons' 8 threads take most of it. */
static void
test_place_equal_costs_take_the_fastest_split(void **state)
{
    (void)state;
    emlio__place_input_t in = s_input(2, 8);
    emlio__place_choice_t c;
    emlio__place_choose(&in, &c);
    assert_true(fabs(c.server_share - 0.875) < 1e-9);
    assert_true(c.images_per_s > 4500 && c.images_per_s < 4600);
    assert_true(fabs(c.best_ips - c.images_per_s) < 1e-9);
    assert_non_null(strstr(c.why, "server share 0.875"));
}

/* A GPU-bound job (the consumer takes 300 images/s) on a host whose cores
 * cost less than the daemon's: every share is fast enough, so the
 * cheapest one (all here) wins. */
static void
test_place_consumer_bound_takes_the_cheapest(void **state)
{
    (void)state;
    emlio__place_input_t in = s_input(2, 8);
    in.server.core_w = 10;
    in.consumer_ips = 300;
    emlio__place_choice_t c;
    emlio__place_choose(&in, &c);
    assert_true(c.server_share == 0);
    assert_string_equal(c.bound, "consumer");
    /* Make the daemon's cores the cheap ones: all goes there. */
    in.server.core_w = 1;
    emlio__place_choose(&in, &c);
    assert_true(c.server_share == 1);
}

/* A narrow link carries more JPEGs than tensors per second: decoding on
 * the daemons would be slower, so it is not chosen even when cheaper. */
static void
test_place_narrow_link_keeps_bytes_small(void **state)
{
    (void)state;
    emlio__place_input_t in = s_input(8, 8);
    in.link_Bps = 11e6; /* 100 JPEGs/s, 73 tensors/s */
    in.server.core_w = 1;
    emlio__place_choice_t c;
    emlio__place_choose(&in, &c);
    assert_true(c.server_share <= 0.25);
    assert_string_equal(c.bound, "link");
    assert_true(c.images_per_s >= c.best_ips * EMLIO_PLACE_SLACK);
}

/* Energy may cost at most 10% of the speed. */
static void
test_place_trades_at_most_ten_percent(void **state)
{
    (void)state;
    /* The daemons are cheap; all on them runs at 4 / 0.002 = 2000/s,
     * the best split at 2000 + client. */
    emlio__place_input_t in = s_input(0.2, 4);
    in.server.core_w = 1;
    emlio__place_choice_t c;
    emlio__place_choose(&in, &c);
    /* Client adds 100/s: 2000 >= 2100 / 1.1, so all goes to the daemons. */
    assert_true(c.server_share == 1);
    /* A client worth 400/s: 2000 < 2400 / 1.1; the cheapest share within
     * 10% of the fastest is taken instead, and it is not f = 1. */
    in.client.threads = 0.8;
    emlio__place_choose(&in, &c);
    assert_true(c.server_share < 1);
    assert_true(c.images_per_s >= c.best_ips * EMLIO_PLACE_SLACK);
    double f = c.server_share;
    /* No share within the slack costs less. */
    for (int k = 0; k <= EMLIO_PLACE_STEPS; k++) {
        double g = (double)k / EMLIO_PLACE_STEPS;
        if (emlio__place_rate(&in, g, NULL) >= c.best_ips * EMLIO_PLACE_SLACK)
            assert_true(emlio__place_joules(&in, g) >=
                        emlio__place_joules(&in, f) - 1e-12);
    }
}

/* A side without threads takes no share; unknown figures borrow the
 * other side's, or the priors. */
static void
test_place_sides_without_threads_or_figures(void **state)
{
    (void)state;
    emlio__place_input_t in = s_input(2, 0);
    emlio__place_choice_t c;
    emlio__place_choose(&in, &c);
    assert_true(c.server_share == 0);
    in = s_input(0, 2);
    emlio__place_choose(&in, &c);
    assert_true(c.server_share == 1);
    in = s_input(2, 2);
    in.server.cpu_s = 0; /* never measured */
    in.client.cpu_s = 0.004;
    const char *bound;
    double r = emlio__place_rate(&in, 0.5, &bound);
    assert_true(fabs(r - 1000) < 1e-6); /* 2 / 0.004 / 0.5 on both */
    in.client.cpu_s = 0;
    r = emlio__place_rate(&in, 0, &bound);
    assert_true(fabs(r - 2 / EMLIO_PLACE_PRIOR_CPU_S) < 1e-6);
    assert_string_equal(bound, "client");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_place_equal_costs_take_the_fastest_split),
        cmocka_unit_test(test_place_consumer_bound_takes_the_cheapest),
        cmocka_unit_test(test_place_narrow_link_keeps_bytes_small),
        cmocka_unit_test(test_place_trades_at_most_ten_percent),
        cmocka_unit_test(test_place_sides_without_threads_or_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
