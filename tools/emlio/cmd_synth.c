/* cmd_synth.c - `emlio synth`: writes a synthetic ImageFolder tree of real
 * JPEG images of a chosen mean size, deterministically from a seed.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "dataset_util.h"
#include "emlio/buf.h"

#define CMD "synth"

/* The mean JPEG size of the ImageNet-1k training set (~140 GB / 1.28 M). */
#define SYNTH_DEFAULT_BYTES   110000
#define SYNTH_DEFAULT_QUALITY 90
#define SYNTH_STR_(x)         #x
#define SYNTH_STR(x)          SYNTH_STR_(x)
#define SYNTH_MIN_SIDE        8
#define SYNTH_MAX_SIDE        16384
#define SYNTH_CALIB_IMAGES    4
/* Noise comes from a table read at a per-row random offset, which is much
 * cheaper than a PRNG step per pixel; JPEG codes each 8x8 block on its own,
 * so the repetition costs no compressed size. The tail lets a row of the
 * widest image run past the wrap point without a bounds check. */
#define SYNTH_NOISE_WRAP      (1u << 16)
#define SYNTH_NOISE_LEN       (SYNTH_NOISE_WRAP + 3u * SYNTH_MAX_SIDE)

typedef struct synth {
    const char *dir;
    uint64_t samples;
    uint64_t classes;
    uint64_t bytes;
    uint64_t seed;
    int width;  /* 0: chosen per image from the target size */
    int height; /* 0: likewise */
    int quality;
    bool force;
    bool quiet;

    tjhandle tj;
    uint8_t *pixels;
    size_t pixels_cap;
    uint16_t *noise; /* SYNTH_NOISE_LEN uniform values, made from the seed */
    unsigned char *jpeg;
    unsigned long jpeg_cap;
    size_t jpeg_len;

    /* Running bytes-per-pixel estimate: bytes and pixels compressed so far
     * (calibration images included). */
    double seen_bytes;
    double seen_pixels;
} synth_t;

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(
        out,
        "usage: emlio synth DIR --samples N --classes C [options]\n"
        "\n"
        "Writes an ImageFolder tree DIR/class_NNN/img_NNNNNNNN.jpg of real\n"
        "JPEG images (gradients, stripes and noise) whose mean size is\n"
        "close to --bytes. Sample i goes to class i %% C. The output is a\n"
        "pure function of the options: the same seed gives the same bytes.\n"
        "\n"
        "options:\n");
    opt_usage(out, tables);
}

static uint64_t
s_image_seed(uint64_t seed, uint64_t index)
{
    uint64_t st = seed ^ (index * 0xd1b54a32d192ed03ull);
    return dataset_rand_next(&st);
}

static inline uint8_t
s_clamp(int v)
{
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Maps a uniform 16-bit value to [-(n / 2), n / 2]. */
static inline int
s_noise(uint32_t r, uint32_t n)
{
    return (int)((r * n) >> 16) - (int)(n >> 1);
}

/* Fills self->pixels with a w x h RGB image: a diagonal two-colour gradient
 * tinted by the class, soft stripes, and per-pixel noise. The noise sets
 * the entropy and hence the compressed size per pixel. */
static int
s_render(synth_t *self, uint64_t rng, uint64_t cls, int w, int h)
{
    size_t need = (size_t)w * (size_t)h * 3;
    if (need > self->pixels_cap) {
        uint8_t *p = realloc(self->pixels, need);
        if (!p)
            return EMLIO_ENOMEM;
        self->pixels = p;
        self->pixels_cap = need;
    }
    int c0[3];
    int c1[3];
    /* The class picks a dominant channel so classes look different. */
    int dom = (int)(cls % 3);
    for (int k = 0; k < 3; k++) {
        c0[k] = (int)dataset_rand_below(&rng, 160) + (k == dom ? 80 : 0);
        c1[k] = (int)dataset_rand_below(&rng, 160) + (k == dom ? 80 : 0);
    }
    int fx = (int)dataset_rand_below(&rng, 24) + 1;
    int fy = (int)dataset_rand_below(&rng, 24) + 1;
    int stripe_amp = (int)dataset_rand_below(&rng, 24) + 8;
    int noise_amp = (int)dataset_rand_below(&rng, 12) + 10; /* +-10..21 */
    int span = w + h > 2 ? w + h - 2 : 1;
    uint32_t noise_n = 2u * (uint32_t)noise_amp + 1;
    /* The gradient runs along x + y in 16.16 fixed point, so the inner loop
     * has no division; a triangle wave stands in for a sine. */
    int32_t step[3];
    for (int k = 0; k < 3; k++)
        step[k] = (int32_t)(((c1[k] - c0[k]) * 65536) / span);
    for (int y = 0; y < h; y++) {
        uint8_t *row = self->pixels + (size_t)y * (size_t)w * 3;
        const uint16_t *noise =
            self->noise + dataset_rand_below(&rng, SYNTH_NOISE_WRAP);
        int32_t b0 = c0[0] * 65536 + step[0] * y + 32768;
        int32_t b1 = c0[1] * 65536 + step[1] * y + 32768;
        int32_t b2 = c0[2] * 65536 + step[2] * y + 32768;
        int phase0 = y * fy;
        for (int x = 0; x < w; x++) {
            int phase = ((x * fx + phase0) >> 1) & 255;
            int tri = phase < 128 ? phase : 255 - phase; /* 0..127 */
            int stripe = ((tri - 64) * stripe_amp) >> 6;
            const uint16_t *nz = noise + x * 3;
            uint8_t *px = row + x * 3;
            px[0] = s_clamp((b0 >> 16) + stripe + s_noise(nz[0], noise_n));
            px[1] = s_clamp((b1 >> 16) + stripe + s_noise(nz[1], noise_n));
            px[2] = s_clamp((b2 >> 16) + stripe + s_noise(nz[2], noise_n));
            b0 += step[0];
            b1 += step[1];
            b2 += step[2];
        }
    }
    return 0;
}

static int
s_compress(synth_t *self, int w, int h, int quality)
{
    unsigned long need = tjBufSize(w, h, TJSAMP_420);
    if (need == (unsigned long)-1)
        return EMLIO_EINVAL;
    if (need > self->jpeg_cap) {
        tjFree(self->jpeg);
        self->jpeg = tjAlloc((int)need);
        self->jpeg_cap = self->jpeg ? need : 0;
        if (!self->jpeg)
            return EMLIO_ENOMEM;
    }
    unsigned long len = self->jpeg_cap;
    if (tjCompress2(self->tj, self->pixels, w, 0, h, TJPF_RGB, &self->jpeg,
                    &len, TJSAMP_420, quality,
                    TJFLAG_NOREALLOC | TJFLAG_FASTDCT) < 0)
        return EMLIO_EINVAL;
    self->jpeg_len = len;
    return 0;
}

/* Picks the size of image i: its area comes from the running
 * bytes-per-pixel estimate, its aspect ratio (0.6..1.6) from the seed. */
static void
s_pick_size(synth_t *self, uint64_t *rng, int *w, int *h)
{
    if (self->width) {
        *w = self->width;
        *h = self->height;
        return;
    }
    double bpp = self->seen_bytes / self->seen_pixels;
    double area = (double)self->bytes / bpp;
    double aspect = 0.6 + (double)dataset_rand_below(rng, 1001) / 1000.0;
    double fw = sqrt(area * aspect);
    double fh = area / fw;
    *w = (int)TOOL_MAX(SYNTH_MIN_SIDE, TOOL_MIN(SYNTH_MAX_SIDE, lround(fw)));
    *h = (int)TOOL_MAX(SYNTH_MIN_SIDE, TOOL_MIN(SYNTH_MAX_SIDE, lround(fh)));
}

/* Compresses a few throwaway images (their own seed stream) to learn the
 * bytes per pixel of this content, or, with a fixed size, the quality whose
 * mean size is closest to the target. */
static int
s_calibrate(synth_t *self)
{
    uint64_t calib_seed = self->seed ^ 0x5eed5eed5eed5eedull;
    if (!self->width) {
        for (int i = 0; i < SYNTH_CALIB_IMAGES; i++) {
            int rc = s_render(self, s_image_seed(calib_seed, (uint64_t)i),
                              (uint64_t)i, 256, 256);
            if (rc == 0)
                rc = s_compress(self, 256, 256, self->quality);
            if (rc < 0)
                return rc;
            self->seen_bytes += (double)self->jpeg_len;
            self->seen_pixels += 256.0 * 256.0;
        }
        return 0;
    }
    if (self->quality > 0)
        return 0; /* fixed size and quality: nothing to choose */
    /* Binary search over quality on the mean of a few calibration images:
     * size grows monotonically with quality for a fixed image. */
    int lo = 5;
    int hi = 98;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        double total = 0;
        for (int i = 0; i < SYNTH_CALIB_IMAGES; i++) {
            int rc = s_render(self, s_image_seed(calib_seed, (uint64_t)i),
                              (uint64_t)i, self->width, self->height);
            if (rc == 0)
                rc = s_compress(self, self->width, self->height, mid);
            if (rc < 0)
                return rc;
            total += (double)self->jpeg_len;
        }
        if (total / SYNTH_CALIB_IMAGES <= (double)self->bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    self->quality = lo;
    return 0;
}

static int
s_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return -errno;
    int rc = dataset_write_all(fd, data, len);
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

static int
s_digits(uint64_t n)
{
    int d = 1;
    while (n >= 10) {
        n /= 10;
        d++;
    }
    return d;
}

static int
s_run(synth_t *self)
{
    char ebuf[128];
    int rc = dataset_mkdir_p(self->dir);
    if (rc < 0) {
        dataset_error(CMD, "cannot create '%s': %s", self->dir,
                      dataset_strerror(rc, ebuf, sizeof(ebuf)));
        return 1;
    }
    if (!self->force) {
        dataset_strv_t names = DATASET_STRV_INIT;
        rc = dataset_list_dir(self->dir, 0, &names);
        size_t n = names.n;
        dataset_strv_release(&names);
        if (rc < 0) {
            dataset_error(CMD, "cannot read '%s': %s", self->dir,
                          dataset_strerror(rc, ebuf, sizeof(ebuf)));
            return 1;
        }
        if (n > 0) {
            dataset_error(CMD,
                          "cannot write to '%s': directory is not empty "
                          "(use --force to write into it anyway)",
                          self->dir);
            return 1;
        }
    }

    int class_width = TOOL_MAX(3, s_digits(self->classes - 1));
    int name_width = TOOL_MAX(8, s_digits(self->samples - 1));
    emlio_buf_t path = EMLIO_BUF_INIT;
    for (uint64_t c = 0; c < self->classes; c++) {
        emlio_buf_clear(&path);
        if (emlio_buf_addf(&path, "%s/class_%0*" PRIu64, self->dir, class_width,
                           c) < 0)
            goto oom;
        if (mkdir((char *)path.data, 0777) < 0 && errno != EEXIST) {
            dataset_error(CMD, "cannot create '%s': %s", (char *)path.data,
                          dataset_strerror(-errno, ebuf, sizeof(ebuf)));
            goto fail;
        }
    }

    double t0 = dataset_now();
    rc = s_calibrate(self);
    if (rc < 0) {
        dataset_error(CMD, "cannot calibrate the image size: %s",
                      rc == EMLIO_EINVAL
                          ? tjGetErrorStr2(self->tj)
                          : dataset_strerror(rc, ebuf, sizeof(ebuf)));
        goto fail;
    }
    uint64_t total = 0;
    size_t min_len = SIZE_MAX;
    size_t max_len = 0;
    double pixels = 0;
    for (uint64_t i = 0; i < self->samples; i++) {
        uint64_t rng = s_image_seed(self->seed, i);
        uint64_t cls = i % self->classes;
        int w;
        int h;
        s_pick_size(self, &rng, &w, &h);
        rc = s_render(self, dataset_rand_next(&rng), cls, w, h);
        if (rc == 0)
            rc = s_compress(self, w, h, self->quality);
        if (rc < 0) {
            dataset_error(CMD, "cannot encode image %" PRIu64 ": %s", i,
                          rc == EMLIO_EINVAL
                              ? tjGetErrorStr2(self->tj)
                              : dataset_strerror(rc, ebuf, sizeof(ebuf)));
            goto fail;
        }
        emlio_buf_clear(&path);
        if (emlio_buf_addf(&path,
                           "%s/class_%0*" PRIu64 "/img_%0*" PRIu64 ".jpg",
                           self->dir, class_width, cls, name_width, i) < 0)
            goto oom;
        rc = s_write_file((char *)path.data, self->jpeg, self->jpeg_len);
        if (rc < 0) {
            dataset_error(CMD, "cannot write '%s': %s", (char *)path.data,
                          dataset_strerror(rc, ebuf, sizeof(ebuf)));
            goto fail;
        }
        self->seen_bytes += (double)self->jpeg_len;
        self->seen_pixels += (double)w * h;
        pixels += (double)w * h;
        total += self->jpeg_len;
        min_len = TOOL_MIN(min_len, self->jpeg_len);
        max_len = TOOL_MAX(max_len, self->jpeg_len);
    }
    double dt = dataset_now() - t0;
    if (!self->quiet) {
        double n = (double)self->samples;
        printf("wrote %" PRIu64 " images in %" PRIu64 " classes to '%s'\n",
               self->samples, self->classes, self->dir);
        if (self->samples > 0) {
            printf("size: mean %.0f bytes (target %" PRIu64
                   "), min %zu, max %zu; mean %.0f pixels, quality %d\n",
                   (double)total / n, self->bytes, min_len, max_len, pixels / n,
                   self->quality);
        }
        printf("time: %.2f s, %.0f images/s, %.1f MB/s\n", dt,
               dt > 0 ? n / dt : 0.0, dt > 0 ? (double)total / dt / 1e6 : 0.0);
    }
    emlio_buf_release(&path);
    return 0;
oom:
    dataset_error(CMD, "out of memory");
fail:
    emlio_buf_release(&path);
    return 1;
}

/* Parses argv into self. Returns -1 to go on, else the exit status. */
static int
s_parse_args(synth_t *self, int argc, char **argv)
{
    bool have_samples = false;
    bool have_classes = false;
    const opt_t table[] = {
        OPT("samples", 'n', OPT_SIZE, &self->samples, "N",
            "number of images (required)", .max = UINT32_MAX,
            .seen = &have_samples),
        OPT("classes", 'c', OPT_U64, &self->classes, "C",
            "number of class directories (required)", .min = 1, .max = 1000000,
            .seen = &have_classes),
        OPT("bytes", 'b', OPT_SIZE, &self->bytes, "B",
            "target mean JPEG size, K/M suffixes allowed\n(default " SYNTH_STR(
                SYNTH_DEFAULT_BYTES) ", the ImageNet mean)",
            .min = 256, .max = 64u << 20),
        OPT("seed", 's', OPT_U64, &self->seed, "S", "seed (default 0)"),
        OPT("width", 'W', OPT_INT, &self->width, "W",
            "fixed image width (with --height); the\nquality is then chosen "
            "to approach --bytes",
            .min = 1, .max = SYNTH_MAX_SIDE),
        OPT("height", 'H', OPT_INT, &self->height, "H",
            "fixed image height (with --width)", .min = 1,
            .max = SYNTH_MAX_SIDE),
        OPT("quality", 'q', OPT_INT, &self->quality, "Q",
            "JPEG quality 1..100 (default " SYNTH_STR(
                SYNTH_DEFAULT_QUALITY) "; with\n--width/--height it overrides "
                                       "--bytes)",
            .min = 1, .max = 100),
        OPT("force", 'f', OPT_FLAG, &self->force, NULL,
            "write into DIR even if it is not empty"),
        OPT("quiet", 0, OPT_FLAG, &self->quiet, NULL, "print no summary"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "show this help"),
        OPT_END,
    };
    const opt_t *tables[] = { table, NULL };
    int npos = 0;
    int status = cli_parse_args(CMD, tables, argc, argv, 0, &npos, s_usage);
    if (status >= 0)
        return status;
    if (npos != 1) {
        dataset_error(CMD,
                      npos == 0 ? "missing DIR" : "expected one DIR, got more");
        s_usage(stderr, tables);
        return 2;
    }
    self->dir = argv[1];
    if (!have_samples || !have_classes) {
        dataset_error(CMD, "--samples and --classes are required");
        s_usage(stderr, tables);
        return 2;
    }
    if (!self->width != !self->height) {
        dataset_error(CMD, "--width and --height go together");
        return 2;
    }
    if (!self->width && !self->quality)
        self->quality = SYNTH_DEFAULT_QUALITY;
    return -1;
}

int
cmd_synth(int argc, char **argv)
{
    synth_t self = { 0 };
    self.bytes = SYNTH_DEFAULT_BYTES;
    int parsed = s_parse_args(&self, argc, argv);
    if (parsed >= 0)
        return parsed;
    self.tj = tjInitCompress();
    if (!self.tj) {
        dataset_error(CMD, "cannot start the JPEG encoder: %s",
                      tjGetErrorStr2(NULL));
        return 1;
    }
    int status = 1;
    self.noise = reallocarray(NULL, SYNTH_NOISE_LEN, sizeof(uint16_t));
    if (self.noise) {
        uint64_t st = self.seed ^ 0x6e6f697365ull;
        for (size_t i = 0; i < SYNTH_NOISE_LEN; i++)
            self.noise[i] = (uint16_t)(dataset_rand_next(&st) >> 48);
        status = s_run(&self);
    } else {
        dataset_error(CMD, "out of memory");
    }
    tjDestroy(self.tj);
    tjFree(self.jpeg);
    free(self.pixels);
    free(self.noise);
    return status;
}
