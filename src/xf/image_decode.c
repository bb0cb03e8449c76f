/* image_decode.c - the transform pipeline's decoders: JPEG through the
 * libjpeg API (libjpeg-turbo), decoding only the rows and columns the
 * resample reads at the strongest DCT reduction it allows, and PNG through
 * libpng. Corrupt input ends in an error, never in exit() or an unbounded
 * allocation: both libraries report through longjmp to here.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <setjmp.h>

#include <jpeglib.h>

#include <jerror.h>
#include <png.h>

#include "transform_ws.h"

/* A progressive JPEG with more scans than this is refused: each scan costs
 * a pass over the coefficients, so thousands of tiny scans are a CPU bomb
 * (libjpeg-turbo's own fuzzers stop at 500 too). */
#define MAX_SCANS       500
/* And the scans' work is bounded: pixels x scans read so far (each scan a
 * pass over every coefficient it refines). 2^31 lets a 100-megapixel
 * image have 21 scans (encoders write about 10) and a 12 MP photo 178,
 * while an arithmetic-coded progressive 100 MP bomb of 499 scans (9.7 s
 * of CPU per decode) stops at its 22nd. */
#define MAX_SCAN_PIXELS ((uint64_t)1 << 31)

typedef struct s_jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int rc;
    char msg[JMSG_LENGTH_MAX];
} s_jerr_t;

typedef struct s_jpeg {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress;
    s_jerr_t jerr;
} s_jpeg_t;

static void
s_jpeg_fail(j_common_ptr cinfo, int rc)
{
    s_jerr_t *e = (s_jerr_t *)cinfo->err;
    e->rc = rc;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jb, 1);
}

static void
s_jpeg_error_exit(j_common_ptr cinfo)
{
    int code = cinfo->err->msg_code;
    int rc = EMLIO_EFORMAT;
    if (code == JERR_OUT_OF_MEMORY)
        rc = EMLIO_ENOMEM;
    else if (code == JERR_NO_BACKING_STORE || code == JERR_TFILE_CREATE) {
        /* max_memory_to_use reached: libjpeg's own words ("Backing store
         * not supported") say nothing a user can act on. */
        s_jerr_t *e = (s_jerr_t *)cinfo->err;
        e->rc = EMLIO_ELIMIT;
        snprintf(e->msg, sizeof(e->msg),
                 "%ux%u needs more memory to decode than one decode may "
                 "hold (%ld MiB left of its limit; fewer transform threads "
                 "or more memory raise it)",
                 ((j_decompress_ptr)cinfo)->image_width,
                 ((j_decompress_ptr)cinfo)->image_height,
                 cinfo->mem->max_memory_to_use >> 20);
        longjmp(e->jb, 1);
    }
    s_jpeg_fail(cinfo, rc);
}

/* Warnings are dropped (PIL accepts "extraneous bytes before marker"),
 * except those that mean the scan is short of data: the file ends early
 * (JWRN_JPEG_EOF), or a marker stands where entropy-coded data should
 * (JWRN_HIT_MARKER: a file cut short and given an end-of-image marker
 * again, issue 34). For both libjpeg would pad the image with grey and
 * return it as if it were whole. */
static void
s_jpeg_emit_message(j_common_ptr cinfo, int level)
{
    if (level < 0 && (cinfo->err->msg_code == JWRN_JPEG_EOF ||
                      cinfo->err->msg_code == JWRN_HIT_MARKER))
        s_jpeg_fail(cinfo, EMLIO_EFORMAT);
}

static void
s_jpeg_output_message(j_common_ptr cinfo)
{
    (void)cinfo; /* the library never prints */
}

static void
s_jpeg_progress(j_common_ptr cinfo)
{
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (!d->is_decompressor)
        return;
    uint64_t pixels = (uint64_t)d->image_width * d->image_height;
    uint64_t scans =
        d->input_scan_number > 0 ? (uint64_t)d->input_scan_number : 0;
    s_jerr_t *e = (s_jerr_t *)cinfo->err;
    if (scans > MAX_SCANS) {
        e->rc = EMLIO_ELIMIT;
        snprintf(e->msg, sizeof(e->msg), "more than %d scans", MAX_SCANS);
        longjmp(e->jb, 1);
    }
    if (pixels && scans > MAX_SCAN_PIXELS / pixels) {
        e->rc = EMLIO_ELIMIT;
        snprintf(e->msg, sizeof(e->msg),
                 "%" PRIu64 " scans of %ux%u pixels: more decoding work than "
                 "the limit (%" PRIu64 " pixel-scans)",
                 scans, d->image_width, d->image_height,
                 (uint64_t)MAX_SCAN_PIXELS);
        longjmp(e->jb, 1);
    }
}

/* Adobe CMYK JPEGs store inverted ink; PIL's CMYK->RGB then multiplies:
 * r = (255 - c)(255 - k) / 255 with PIL's MULDIV255 rounding. In place:
 * the 3-byte output never overtakes the 4-byte input. */
static void
s_cmyk_to_rgb(uint8_t *row, size_t width, bool inverted)
{
    for (size_t x = 0; x < width; x++) {
        unsigned c = row[x * 4], m = row[x * 4 + 1], y = row[x * 4 + 2];
        unsigned k = row[x * 4 + 3];
        if (!inverted) {
            c = 255 - c;
            m = 255 - m;
            y = 255 - y;
            k = 255 - k;
        }
        unsigned t;
        t = c * k + 128;
        row[x * 3] = (uint8_t)(((t >> 8) + t) >> 8);
        t = m * k + 128;
        row[x * 3 + 1] = (uint8_t)(((t >> 8) + t) >> 8);
        t = y * k + 128;
        row[x * 3 + 2] = (uint8_t)(((t >> 8) + t) >> 8);
    }
}

static s_jpeg_t *
s_jpeg_state(emlio_transform_ws_t *ws)
{
    if (ws->jpeg)
        return ws->jpeg;
    s_jpeg_t *j = emlio_calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->cinfo.err = jpeg_std_error(&j->jerr.pub);
    j->jerr.pub.error_exit = s_jpeg_error_exit;
    j->jerr.pub.emit_message = s_jpeg_emit_message;
    j->jerr.pub.output_message = s_jpeg_output_message;
    if (setjmp(j->jerr.jb)) {
        free(j); /* only jpeg_create_decompress can get here */
        return NULL;
    }
    jpeg_create_decompress(&j->cinfo);
    j->progress.progress_monitor = s_jpeg_progress;
    j->cinfo.progress = &j->progress;
    ws->jpeg = j;
    return j;
}

void
emlio__image_ws_release(emlio_transform_ws_t *ws)
{
    s_jpeg_t *j = ws->jpeg;
    if (!j)
        return;
    jpeg_destroy_decompress(&j->cinfo);
    free(j);
    ws->jpeg = NULL;
}

/* After jpeg_start_decompress: narrows the output to the region's columns
 * (libjpeg widens it to whole iMCUs), skips to its first row, reads its
 * rows into ws->region. Any libjpeg error longjmps to the caller. */
/* Entropy-decodes the rows below the crop, so that a scan short of data
 * fails (s_jpeg_emit_message) whatever the epoch's crop: the image's last
 * row is read, the ones before it skipped, which costs Huffman decoding but
 * no IDCT or colour conversion (libjpeg-turbo skips straight to the end
 * without decoding, so the last row is read, not skipped). A progressive
 * image has read all its scans already in jpeg_start_decompress. */
static int
s_jpeg_read_to_the_end(struct jpeg_decompress_struct *ci)
{
    if (ci->output_scanline >= ci->output_height)
        return 0;
    JDIMENSION last = ci->output_height - 1;
    if (ci->output_scanline < last)
        jpeg_skip_scanlines(ci, last - ci->output_scanline);
    JSAMPARRAY row = (*ci->mem->alloc_sarray)(
        (j_common_ptr)ci, JPOOL_IMAGE,
        ci->output_width * (JDIMENSION)ci->output_components, 1);
    (void)jpeg_read_scanlines(ci, row, 1);
    return 0;
}

static int
s_jpeg_read_region(s_jpeg_t *j, emlio_transform_ws_t *ws,
                   const emlio__resample_t *rs, size_t *stride, uint32_t *x0,
                   char *errbuf, size_t errlen)
{
    struct jpeg_decompress_struct *ci = &j->cinfo;
    /* Fancy upsampling treats the cropped edge as the image's edge, which
     * changes the chroma of the last columns: decode two more each side. */
    JDIMENSION xoff = rs->x0 > 2 ? rs->x0 - 2 : 0;
    JDIMENSION width = EMLIO_MIN(rs->x1 + 2, ci->output_width) - xoff;
    if (width < ci->output_width)
        jpeg_crop_scanline(ci, &xoff, &width);
    else
        xoff = 0;
    size_t ncomp = (size_t)ci->output_components;
    *stride = (size_t)ci->output_width * ncomp;
    *x0 = xoff;
    size_t rows = rs->y1 - rs->y0;
    int rc =
        emlio__resample_reserve_region(rs, ws, rows * *stride, errbuf, errlen);
    if (rc < 0)
        return rc;
    if (rs->y0 > 0 && jpeg_skip_scanlines(ci, rs->y0) != rs->y0)
        return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT,
                             "jpeg: cannot skip to row %u", rs->y0);
    uint8_t *base = ws->region.p;
    while (ci->output_scanline < rs->y1) {
        JSAMPROW ptrs[8];
        JDIMENSION want = EMLIO_MIN(8u, rs->y1 - ci->output_scanline);
        for (JDIMENSION i = 0; i < want; i++)
            ptrs[i] = base + (ci->output_scanline - rs->y0 + i) * *stride;
        JDIMENSION got = jpeg_read_scanlines(ci, ptrs, want);
        if (got == 0)
            return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT,
                                 "jpeg: no data for row %u",
                                 ci->output_scanline);
        if (ncomp == 4)
            for (JDIMENSION i = 0; i < got; i++)
                s_cmyk_to_rgb(ptrs[i], ci->output_width, ci->saw_Adobe_marker);
    }
    return s_jpeg_read_to_the_end(ci);
}

/* Whether the JPEG's entropy-coded data ends in an end-of-image marker.
 * A crop decodes only the rows it needs, so a file cut short below them
 * decoded cleanly or failed with the epoch's draw (issue 34); this looks
 * at the bytes instead, the same for every crop. The marker is searched
 * after the first start-of-scan (an EXIF thumbnail earlier holds its own
 * EOI); FF D9 cannot occur inside entropy-coded data, where FF is
 * stuffed. Trailing bytes after EOI are accepted, as PIL does. */
static bool
s_jpeg_has_eoi(const uint8_t *data, size_t len)
{
    size_t p = 2; /* after SOI */
    while (p + 4 <= len) {
        if (data[p] != 0xff)
            return true; /* not markers: libjpeg judges */
        uint8_t m = data[p + 1];
        if (m == 0xff) {
            p++; /* fill byte */
            continue;
        }
        if (m == 0xda)
            break;
        if (m == 0x01 || (m >= 0xd0 && m <= 0xd8)) {
            p += 2; /* markers without a length */
            continue;
        }
        p += 2 + ((size_t)data[p + 2] << 8 | data[p + 3]);
    }
    for (size_t i = p; i + 1 < len; i++) {
        const uint8_t *ff = memchr(data + i, 0xff, len - i - 1);
        if (!ff)
            return false;
        i = (size_t)(ff - data);
        if (data[i + 1] == 0xd9)
            return true;
    }
    return false;
}

static int
s_jpeg(emlio_transform_ws_t *ws, const uint8_t *data, size_t len,
       uint64_t max_pixels, emlio__geometry_fn *geometry, void *ctx,
       emlio__resample_t *rs, uint8_t *out, char *errbuf, size_t errlen)
{
    s_jpeg_t *j = s_jpeg_state(ws);
    if (!j)
        return emlio__tf_err(errbuf, errlen, EMLIO_ENOMEM,
                             "jpeg: out of memory");
    struct jpeg_decompress_struct *ci = &j->cinfo;
    if (setjmp(j->jerr.jb)) {
        jpeg_abort_decompress(ci);
        return emlio__tf_err(errbuf, errlen, j->jerr.rc, "jpeg: %s",
                             j->jerr.msg);
    }
    jpeg_mem_src(ci, data, (unsigned long)len);
    if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
        jpeg_abort_decompress(ci);
        return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT,
                             "jpeg: no image in the file");
    }
    if (!s_jpeg_has_eoi(data, len)) {
        jpeg_abort_decompress(ci);
        return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT,
                             "jpeg: truncated (no end-of-image marker after "
                             "the image data)");
    }
    uint64_t pixels = (uint64_t)ci->image_width * ci->image_height;
    int rc = 0;
    if (pixels > max_pixels)
        rc = emlio__tf_err(errbuf, errlen, EMLIO_ELIMIT,
                           "jpeg: %ux%u is more than %" PRIu64 " pixels",
                           ci->image_width, ci->image_height, max_pixels);
    if (rc == 0)
        rc = geometry(ctx, ci->image_width, ci->image_height, rs, errbuf,
                      errlen);
    if (rc < 0) {
        jpeg_abort_decompress(ci);
        return rc;
    }
    uint32_t r = emlio__resample_max_reduction(rs);
    ci->scale_num = 1;
    ci->scale_denom = r;
    ci->dct_method = JDCT_ISLOW;
    bool cmyk =
        ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
    ci->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    uint64_t room = ws->max_bytes > ws->held ? ws->max_bytes - ws->held : 0;
    ci->mem->max_memory_to_use = (long)EMLIO_MIN(room, (uint64_t)LONG_MAX);
    jpeg_calc_output_dimensions(ci);
    rc = emlio__resample_prepare(rs, ws, r, ci->output_width, ci->output_height,
                                 errbuf, errlen);
    size_t stride = 0;
    uint32_t x0 = 0;
    if (rc == 0) {
        jpeg_start_decompress(ci);
        rc = s_jpeg_read_region(j, ws, rs, &stride, &x0, errbuf, errlen);
    }
    jpeg_abort_decompress(ci);
    if (rc == 0)
        rc = emlio__resample_run(rs, ws, ws->region.p, stride, x0, out, errbuf,
                                 errlen);
    return rc;
}

/* PNG: libpng reads from memory through this. */
typedef struct s_png_src {
    const uint8_t *data;
    size_t len, pos;
    char msg[256];
} s_png_src_t;

static void
s_png_read(png_structp png, png_bytep out, size_t n)
{
    s_png_src_t *src = png_get_io_ptr(png);
    if (n > src->len - src->pos)
        png_error(png, "file ends early");
    memcpy(out, src->data + src->pos, n);
    src->pos += n;
}

static void
s_png_error(png_structp png, png_const_charp msg)
{
    s_png_src_t *src = png_get_error_ptr(png);
    snprintf(src->msg, sizeof(src->msg), "%s", msg);
    png_longjmp(png, 1);
}

static void
s_png_warning(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

/* Asks libpng for 8-bit RGB whatever the file holds: palette and low bit
 * depths expanded, 16 bits cut to the high byte (as PIL does), grey
 * replicated, alpha dropped. Returns the number of interlace passes. */
static int
s_png_rgb8(png_structp png, png_infop info)
{
    int color = png_get_color_type(png, info);
    png_set_expand(png);
    png_set_strip_16(png);
    png_set_strip_alpha(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    return passes;
}

/* Reads rows [0, y1) (all rows of all passes when interlaced) and keeps
 * [y0, y1) at the start of ws->region, full width. */
static int
s_png_read_rows(png_structp png, emlio_transform_ws_t *ws,
                const emlio__resample_t *rs, uint32_t w, uint32_t h, int passes,
                char *errbuf, size_t errlen)
{
    size_t stride = (size_t)w * 3;
    size_t rows = passes > 1 ? h : rs->y1 - rs->y0 + 1;
    int rc =
        emlio__resample_reserve_region(rs, ws, rows * stride, errbuf, errlen);
    if (rc < 0)
        return rc;
    uint8_t *buf = ws->region.p;
    if (passes > 1) {
        for (int p = 0; p < passes; p++)
            for (uint32_t y = 0; y < h; y++)
                png_read_row(png, buf + (size_t)y * stride, NULL);
        memmove(buf, buf + (size_t)rs->y0 * stride,
                (size_t)(rs->y1 - rs->y0) * stride);
        return 0;
    }
    /* Rows before the region go through the spare last row. */
    uint8_t *spare = buf + (rows - 1) * stride;
    for (uint32_t y = 0; y < rs->y1; y++)
        png_read_row(png, y < rs->y0 ? spare : buf + (y - rs->y0) * stride,
                     NULL);
    return 0;
}

static int
s_png(emlio_transform_ws_t *ws, const uint8_t *data, size_t len,
      uint64_t max_pixels, emlio__geometry_fn *geometry, void *ctx,
      emlio__resample_t *rs, uint8_t *out, char *errbuf, size_t errlen)
{
    s_png_src_t src = { .data = data, .len = len };
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src,
                                             s_png_error, s_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return emlio__tf_err(errbuf, errlen, EMLIO_ENOMEM,
                             "png: out of memory");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT, "png: %s", src.msg);
    }
    png_set_read_fn(png, &src, s_png_read);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_read_info(png, info);
    uint32_t w = png_get_image_width(png, info);
    uint32_t h = png_get_image_height(png, info);
    int rc = 0;
    if ((uint64_t)w * h > max_pixels)
        rc = emlio__tf_err(errbuf, errlen, EMLIO_ELIMIT,
                           "png: %ux%u is more than %" PRIu64 " pixels", w, h,
                           max_pixels);
    /* libpng's own row buffers (a few rows of up to 8 bytes a pixel) are
     * not ours to reserve, but count against the cap: a PNG may be
     * 100,000,000 x 1. */
    uint64_t lib_bytes =
        3 * EMLIO_MAX((uint64_t)png_get_rowbytes(png, info), (uint64_t)w * 8);
    uint64_t room = ws->max_bytes > ws->held ? ws->max_bytes - ws->held : 0;
    if (rc == 0 && lib_bytes > room)
        rc = emlio__tf_err(errbuf, errlen, EMLIO_ELIMIT,
                           "png: rows of %u pixels need more than the "
                           "workspace's cap",
                           w);
    if (rc == 0)
        rc = geometry(ctx, w, h, rs, errbuf, errlen);
    if (rc == 0)
        rc = emlio__resample_prepare(rs, ws, 1, w, h, errbuf, errlen);
    if (rc == 0) {
        int passes = s_png_rgb8(png, info);
        if (png_get_rowbytes(png, info) != (size_t)w * 3)
            rc = emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT,
                               "png: unsupported pixel layout");
        else
            rc = s_png_read_rows(png, ws, rs, w, h, passes, errbuf, errlen);
    }
    png_destroy_read_struct(&png, &info, NULL);
    if (rc == 0)
        rc = emlio__resample_run(rs, ws, ws->region.p, (size_t)w * 3, 0, out,
                                 errbuf, errlen);
    return rc;
}

int
emlio__image_transform(emlio_transform_ws_t *ws, const uint8_t *data,
                       size_t len, uint64_t max_pixels,
                       emlio__geometry_fn *geometry, void *ctx,
                       emlio__resample_t *rs, uint8_t *out, char *errbuf,
                       size_t errlen)
{
    static const uint8_t png_magic[8] = { 0x89, 'P',  'N',  'G',
                                          '\r', '\n', 0x1a, '\n' };
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
        return s_jpeg(ws, data, len, max_pixels, geometry, ctx, rs, out, errbuf,
                      errlen);
    if (len >= 8 && memcmp(data, png_magic, 8) == 0)
        return s_png(ws, data, len, max_pixels, geometry, ctx, rs, out, errbuf,
                     errlen);
    if (len == 0)
        return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT, "empty image");
    return emlio__tf_err(errbuf, errlen, EMLIO_EFORMAT,
                         "not a JPEG or PNG (starts %02x %02x %02x %02x)",
                         data[0], len > 1 ? data[1] : 0, len > 2 ? data[2] : 0,
                         len > 3 ? data[3] : 0);
}
