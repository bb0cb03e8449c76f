/* test_tar.c - unit tests of the WebDataset tar walk and wds2idx indexes,
 * on archives built here byte by byte (the headers GNU tar and tarfile do
 * not write by default: ustar prefixes, pax sizes, base-256 sizes, signed
 * checksums).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_test.h"

#include "tar.h"

/* Appends one 512-byte header (and nothing else) to out. size_field may
 * be NULL to write size in octal; type is the typeflag. */
static void
s_header(emlio_buf_t *out, const char *name, const char *prefix, uint64_t size,
         char type, const uint8_t *size_field, bool signed_sum)
{
    uint8_t h[512];
    memset(h, 0, sizeof(h));
    memcpy(h, name, strlen(name));
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 108, 8, "%07o", 0);
    snprintf((char *)h + 116, 8, "%07o", 0);
    if (size_field)
        memcpy(h + 124, size_field, 12);
    else {
        char octal[32];
        snprintf(octal, sizeof(octal), "%011" PRIo64, size);
        memcpy(h + 124, octal, 11);
    }
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = (uint8_t)type;
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    if (prefix)
        memcpy(h + 345, prefix, strlen(prefix));
    if (signed_sum)
        h[300] = 0xff; /* makes the signed and unsigned sums differ */
    memset(h + 148, ' ', 8);
    long sum = 0;
    for (size_t i = 0; i < sizeof(h); i++)
        sum += signed_sum ? (int8_t)h[i] : h[i];
    snprintf((char *)h + 148, 8, "%06lo", (unsigned long)sum & 0777777);
    h[155] = ' ';
    assert_int_equal(emlio_buf_add(out, h, sizeof(h)), 0);
}

static void
s_data(emlio_buf_t *out, const void *data, size_t len)
{
    static const uint8_t zeros[512];
    assert_int_equal(emlio_buf_add(out, data, len), 0);
    assert_int_equal(emlio_buf_add(out, zeros, (512 - len % 512) % 512), 0);
}

static void
s_member(emlio_buf_t *out, const char *name, const char *data)
{
    s_header(out, name, NULL, strlen(data), '0', NULL, false);
    s_data(out, data, strlen(data));
}

static void
s_end(emlio_buf_t *out)
{
    static const uint8_t zeros[1024];
    assert_int_equal(emlio_buf_add(out, zeros, sizeof(zeros)), 0);
}

/* The bytes of field f of sample i, or NULL. */
static const char *
s_field(const emlio__tar_index_t *idx, const emlio_buf_t *tar, size_t i,
        const char *f, size_t *len)
{
    for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++)
        if (!strcmp(idx->fields[idx->members[m].field], f)) {
            *len = (size_t)idx->members[m].len;
            return (const char *)tar->data + idx->members[m].offset;
        }
    return NULL;
}

static void
test_tar_groups_samples_as_webdataset(void **state)
{
    (void)state;
    emlio_buf_t tar = EMLIO_BUF_INIT;
    char err[EMLIO_ERRMSG_LEN];
    s_header(&tar, "dir/", NULL, 0, '5', NULL, false); /* a directory */
    s_member(&tar, "README", "no key: skipped");
    s_member(&tar, "dir/.hidden.txt", "leading dot: skipped");
    s_member(&tar, "./dir/a.b.JPG", "A"); /* key dir/a, field b.jpg */
    s_member(&tar, "dir/a.cls", "3\n");
    s_member(&tar, "dir/b.cls", "x"); /* not a number: label -1 */
    s_header(&tar, "link.jpg", NULL, 0, '2', NULL, false); /* symlink */
    /* ustar prefix + name. */
    s_header(&tar, "c.jpg", "some/prefix", 2, '0', NULL, false);
    s_data(&tar, "CC", 2);
    s_end(&tar);
    emlio__tar_index_t idx;
    int rc = emlio__tar_scan_mem(tar.data, tar.len, "t.tar", &idx, err);
    assert_int_equal(rc, 3);
    assert_int_equal(idx.n_members, 4);
    assert_true(emlio__tar_table_ok(&idx, tar.len));
    /* A member listed over another's bytes (a forged table) is refused. */
    emlio__tar_member_t kept = idx.members[1];
    idx.members[1] = idx.members[0];
    assert_false(emlio__tar_table_ok(&idx, tar.len));
    idx.members[1] = kept;
    assert_string_equal(idx.names[0], "dir/a.b.JPG");
    assert_string_equal(idx.names[3], "some/prefix/c.jpg");
    size_t len;
    const char *p = s_field(&idx, &tar, 0, "b.jpg", &len);
    assert_non_null(p);
    assert_int_equal(len, 1);
    assert_memory_equal(p, "A", 1);
    assert_non_null(s_field(&idx, &tar, 0, "cls", &len));
    assert_null(s_field(&idx, &tar, 1, "jpg", &len));
    p = s_field(&idx, &tar, 2, "jpg", &len);
    assert_memory_equal(p, "CC", 2);
    emlio__tar_index_release(&idx);
    emlio_buf_release(&tar);
}

static void
test_tar_long_names_pax_and_base256(void **state)
{
    (void)state;
    emlio_buf_t tar = EMLIO_BUF_INIT;
    char err[EMLIO_ERRMSG_LEN];
    char longname[300];
    memset(longname, 'n', 250);
    memcpy(longname + 250, "/k.jpg", 7);
    /* GNU long name. */
    s_header(&tar, "././@LongLink", NULL, strlen(longname) + 1, 'L', NULL,
             false);
    s_data(&tar, longname, strlen(longname) + 1);
    s_header(&tar, "truncated-name.jpg", NULL, 3, '0', NULL, false);
    s_data(&tar, "abc", 3);
    /* pax path and size (the header's own size field says 0). */
    const char *pax = "19 path=pax/p.json\n10 size=5\n";
    s_header(&tar, "PaxHeaders/p", NULL, strlen(pax), 'x', NULL, false);
    s_data(&tar, pax, strlen(pax));
    s_header(&tar, "p.json", NULL, 0, '0', NULL, false);
    s_data(&tar, "12345", 5);
    /* GNU base-256 size and a signed checksum (old writers). */
    uint8_t b256[12] = { 0x80 };
    b256[11] = 4;
    s_header(&tar, "q.png", NULL, 0, '0', b256, true);
    s_data(&tar, "wxyz", 4);
    s_end(&tar);
    emlio__tar_index_t idx;
    int rc = emlio__tar_scan_mem(tar.data, tar.len, "t.tar", &idx, err);
    assert_int_equal(rc, 3);
    assert_string_equal(idx.names[0], longname);
    assert_string_equal(idx.names[1], "pax/p.json");
    assert_int_equal(idx.members[1].len, 5);
    assert_int_equal(idx.members[2].len, 4);
    emlio__tar_index_release(&idx);
    emlio_buf_release(&tar);
}

static void
test_tar_errors_name_file_and_offset(void **state)
{
    (void)state;
    char err[EMLIO_ERRMSG_LEN];
    emlio__tar_index_t idx;
    emlio_buf_t tar = EMLIO_BUF_INIT;
    s_member(&tar, "a.jpg", "1");
    s_member(&tar, "a.jpg", "2"); /* the same field twice in one sample */
    s_end(&tar);
    assert_int_equal(emlio__tar_scan_mem(tar.data, tar.len, "d.tar", &idx, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "duplicate field 'jpg'"));
    assert_non_null(strstr(err, "'d.tar' at offset 1024"));
    assert_null(idx.members);
    /* A flipped header byte. */
    ((uint8_t *)tar.data)[1024 + 3] ^= 1;
    assert_int_equal(emlio__tar_scan_mem(tar.data, tar.len, "d.tar", &idx, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "bad tar header checksum in 'd.tar' at "
                                "offset 1024"));
    /* Truncated inside a member's data, and inside a header. */
    emlio_buf_clear(&tar);
    s_header(&tar, "big.jpg", NULL, 5000, '0', NULL, false);
    assert_int_equal(emlio_buf_add(&tar, "xxxx", 4), 0);
    assert_int_equal(emlio__tar_scan_mem(tar.data, tar.len, "t.tar", &idx, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "truncated tar member in 't.tar' at offset 0"));
    assert_int_equal(emlio__tar_scan_mem(tar.data, 300, "t.tar", &idx, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "truncated tar header"));
    /* Empty input and end blocks only: a valid archive of no samples. */
    assert_int_equal(emlio__tar_scan_mem(NULL, 0, "e.tar", &idx, err), 0);
    emlio_buf_clear(&tar);
    s_end(&tar);
    assert_int_equal(emlio__tar_scan_mem(tar.data, tar.len, "e.tar", &idx, err),
                     0);
    emlio_buf_release(&tar);
}

/* Samples k0..k4, each "image i" as jpg and 2i as cls. */
static void
s_five_samples(emlio_buf_t *tar)
{
    for (int i = 0; i < 5; i++) {
        char name[32], data[32];
        snprintf(name, sizeof(name), "k%d.jpg", i);
        snprintf(data, sizeof(data), "image %d", i);
        s_member(tar, name, data);
        snprintf(name, sizeof(name), "k%d.cls", i);
        snprintf(data, sizeof(data), "%d", i * 2);
        s_member(tar, name, data);
    }
    s_end(tar);
}

/* The five samples as s.tar in a temporary directory of their own, for the
 * tests of its index file. */
typedef struct {
    char dir[64];
    char path[128]; /* dir/s.tar */
    char idxp[160]; /* its index: dir/s.tar.idx */
    emlio_buf_t tar;
} s_shard_t;

static void
s_shard_init(s_shard_t *self)
{
    test_mkdtemp(self->dir, sizeof(self->dir));
    snprintf(self->path, sizeof(self->path), "%s/s.tar", self->dir);
    snprintf(self->idxp, sizeof(self->idxp), "%s.idx", self->path);
    emlio_buf_init(&self->tar);
    s_five_samples(&self->tar);
    test_write_file(self->path, self->tar.data, self->tar.len);
}

static void
s_shard_release(s_shard_t *self)
{
    emlio_buf_release(&self->tar);
    test_rmtree(self->dir);
}

/* The shard at path, opened. */
static emlio__tar_t *
s_open(const char *path)
{
    emlio__tar_t *t = emlio__tar_new(path);
    assert_non_null(t);
    assert_int_equal(emlio__tar_open(t), 0);
    return t;
}

static void
test_tar_index_round_trip_and_stale(void **state)
{
    (void)state;
    s_shard_t sh;
    s_shard_init(&sh);
    emlio__tar_t *t = s_open(sh.path);
    assert_int_equal(emlio__tar_load_index(t, sh.idxp), -ENOENT);
    assert_int_equal(emlio__tar_scan(t), 5);
    assert_int_equal(emlio__tar_write_index(t, sh.idxp), 0);
    assert_int_equal(emlio__tar_label(t, 3, "cls"), 6);
    const uint8_t *d;
    size_t len;
    assert_int_equal(emlio__tar_field(t, 4, "jpg", &d, &len), 0);
    assert_memory_equal(d, "image 4", 7);
    assert_int_equal(emlio__tar_field(t, 4, "png", &d, &len), -ENOENT);
    assert_int_equal(emlio__tar_field(t, 5, "jpg", &d, &len), EMLIO_ENOTFOUND);
    emlio__tar_destroy(&t);
    /* Loaded back: the same samples. */
    t = s_open(sh.path);
    assert_int_equal(emlio__tar_load_index(t, sh.idxp), 5);
    assert_int_equal(emlio__tar_label(t, 2, "cls"), 4);
    emlio__tar_destroy(&t);
    /* An index that does not describe the file is refused. */
    emlio_buf_t text = EMLIO_BUF_INIT;
    assert_int_equal(emlio_buf_addf(&text, "v1.2 1\njpg 512 3 k0.jpg\n"), 0);
    emlio__tar_index_t idx;
    char err[EMLIO_ERRMSG_LEN];
    assert_int_equal(emlio__tar_parse_index((const char *)text.data, text.len,
                                            "x.idx", sh.tar.data, sh.tar.len,
                                            "s.tar", &idx, err),
                     EMLIO_EFORMAT);
    assert_non_null(strstr(err, "line 2"));
    /* Older than the shard: stale. */
    struct timespec old[2] = { { 1000, 0 }, { 1000, 0 } };
    assert_int_equal(utimensat(AT_FDCWD, sh.idxp, old, 0), 0);
    t = s_open(sh.path);
    assert_int_equal(emlio__tar_load_index(t, sh.idxp), -ESTALE);
    emlio__tar_destroy(&t);
    emlio_buf_release(&text);
    s_shard_release(&sh);
}

/* An index is a hint: one that leaves a sample out, or lists a label
 * member as a sample's image, is refused though each member it lists is a
 * valid member of the shard (the offsets, sizes and headers check out). */
static void
test_tar_index_that_lies_is_refused(void **state)
{
    (void)state;
    s_shard_t sh;
    s_shard_init(&sh);
    /* Member j: header at j * 1024, data at j * 1024 + 512. */
    const char *lies[] = {
        /* sample k2 left out */
        "v1.2 4\n"
        "jpg 512 7 k0.jpg cls 1536 1 k0.cls\n"
        "jpg 2560 7 k1.jpg cls 3584 1 k1.cls\n"
        "jpg 6656 7 k3.jpg cls 7680 1 k3.cls\n"
        "jpg 8704 7 k4.jpg cls 9728 1 k4.cls\n",
        /* k1's label member listed as its image */
        "v1.2 5\n"
        "jpg 512 7 k0.jpg cls 1536 1 k0.cls\n"
        "jpg 3584 1 k1.jpg\n"
        "jpg 4608 7 k2.jpg cls 5632 1 k2.cls\n"
        "jpg 6656 7 k3.jpg cls 7680 1 k3.cls\n"
        "jpg 8704 7 k4.jpg cls 9728 1 k4.cls\n",
    };
    for (size_t k = 0; k < EMLIO_ARRAY_SIZE(lies); k++) {
        test_write_file(sh.idxp, lies[k], strlen(lies[k]));
        emlio__tar_t *t = s_open(sh.path);
        assert_int_equal(emlio__tar_load_index(t, sh.idxp), EMLIO_EFORMAT);
        assert_non_null(strstr(emlio__tar_errmsg(t), "does not describe"));
        assert_int_equal(emlio__tar_count(t), 0);
        emlio__tar_destroy(&t);
    }
    /* The truth is accepted. */
    const char *truth = "v1.2 5\n"
                        "jpg 512 7 k0.jpg cls 1536 1 k0.cls\n"
                        "jpg 2560 7 k1.jpg cls 3584 1 k1.cls\n"
                        "jpg 4608 7 k2.jpg cls 5632 1 k2.cls\n"
                        "jpg 6656 7 k3.jpg cls 7680 1 k3.cls\n"
                        "jpg 8704 7 k4.jpg cls 9728 1 k4.cls\n";
    test_write_file(sh.idxp, truth, strlen(truth));
    emlio__tar_t *t = s_open(sh.path);
    assert_int_equal(emlio__tar_load_index(t, sh.idxp), 5);
    emlio__tar_destroy(&t);
    s_shard_release(&sh);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tar_groups_samples_as_webdataset),
        cmocka_unit_test(test_tar_long_names_pax_and_base256),
        cmocka_unit_test(test_tar_errors_name_file_and_offset),
        cmocka_unit_test(test_tar_index_round_trip_and_stale),
        cmocka_unit_test(test_tar_index_that_lies_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
