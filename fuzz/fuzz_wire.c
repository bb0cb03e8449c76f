/* fuzz_wire.c - libFuzzer harness for the protocol header decoder, the
 * parser every byte from the network goes through on both sides.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    emlio__wire_msg_t msg;
    char err[EMLIO_ERRMSG_LEN];
    /* Both the server's limit and the unlimited client path. */
    if (emlio__wire_decode(&msg, data, size, 64, err) >= 0)
        emlio__wire_msg_release(&msg);
    if (emlio__wire_decode(&msg, data, size, 0, err) >= 0) {
        /* Touch what the callers touch, so ASan checks the borrowed
         * pointers really lie inside the input. */
        volatile uint8_t sink = 0;
        const char *name = msg.type == EMLIO_MSG_HELLO     ? msg.hello.name
                           : msg.type == EMLIO_MSG_WELCOME ? msg.welcome.name
                                                           : NULL;
        size_t name_len = msg.type == EMLIO_MSG_HELLO     ? msg.hello.name_len
                          : msg.type == EMLIO_MSG_WELCOME ? msg.welcome.name_len
                                                          : 0;
        for (size_t i = 0; i < name_len; i++)
            sink ^= (uint8_t)name[i];
        if (msg.type == EMLIO_MSG_WELCOME)
            for (size_t i = 0; i < msg.welcome.n_shards; i++)
                for (size_t j = 0; j < msg.welcome.shards[i].name_len; j++)
                    sink ^= (uint8_t)msg.welcome.shards[i].name[j];
        if (msg.type == EMLIO_MSG_ERROR)
            for (size_t i = 0; i < msg.error.text_len; i++)
                sink ^= (uint8_t)msg.error.text[i];
        const emlio__msg_batch_t *b = &msg.batch;
        if (msg.type == EMLIO_MSG_BATCH) {
            for (size_t i = 0; i < b->n_where; i++)
                for (size_t j = 0; j < b->where[i].len; j++)
                    sink ^= (uint8_t)b->where[i].s[j];
        }
        /* A packed BATCH's table, against the frames a client might have
         * received: a packed frame of the input's own size, and none. */
        if (msg.type == EMLIO_MSG_BATCH && b->packed) {
            int own = emlio__wire_pack_check(b->spans, b->n_spans, b->n_spans,
                                             true, size, err);
            /* Every span it accepts lies inside the frame. */
            for (size_t i = 0; own >= 0 && i < b->n_spans; i++)
                if (b->spans[i].off != EMLIO_WIRE_PACK_OWN)
                    for (uint64_t j = 0; j < b->spans[i].len; j++)
                        sink ^= data[b->spans[i].off + j];
            (void)emlio__wire_pack_check(b->spans, b->n_spans, b->n_samples,
                                         false, 0, err);
        }
        (void)sink;
        emlio__wire_msg_release(&msg);
    }
    return 0;
}
