/* folder_tree.c - makes an ImageFolder tree of tiny files fast, for the
 * start-up benchmark (bench/folder_start.sh) and the suite's scale test:
 * ROOT/class_NNNN/img_NNNNNNN.jpg, FILES spread over CLASSES as evenly as
 * ImageNet's 1,281,167 over 1,000. Each file is a hard link to its class's
 * 16-byte CLASS/.seed (hidden, so never served; one per class because ext4
 * allows 65,000 links to an inode) unless --copies is given, when each is
 * its own tiny file (distinct inodes: what a real tree has).
 *   folder_tree ROOT FILES CLASSES [--copies]
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One class directory's files: links to the seed, or small files. */
static int
s_fill(int dfd, long first, long count, int copies)
{
    char name[64];
    int sfd = openat(dfd, ".seed", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (sfd < 0)
        return -errno;
    ssize_t sw = write(sfd, "\xff\xd8\xff\xe0 tiny image\n", 16);
    close(sfd);
    if (sw != 16)
        return -EIO;
    for (long k = 0; k < count; k++) {
        snprintf(name, sizeof(name), "img_%07ld.jpg", first + k);
        if (!copies) {
            if (linkat(dfd, ".seed", dfd, name, 0) != 0 && errno != EEXIST)
                return -errno;
            continue;
        }
        int fd =
            openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            return -errno;
        char body[32];
        int n = snprintf(body, sizeof(body), "\xff\xd8 %ld\n", first + k);
        ssize_t w = write(fd, body, (size_t)n);
        close(fd);
        if (w != n)
            return -EIO;
    }
    return 0;
}

int
main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: folder_tree ROOT FILES CLASSES [--copies]\n");
        return 2;
    }
    const char *root = argv[1];
    long files = atol(argv[2]);
    long classes = atol(argv[3]);
    int copies = argc > 4 && strcmp(argv[4], "--copies") == 0;
    if (files < 1 || classes < 1 || classes > files) {
        fprintf(stderr, "folder_tree: need FILES >= CLASSES >= 1\n");
        return 2;
    }
    if (mkdir(root, 0755) != 0 && errno != EEXIST) {
        perror(root);
        return 1;
    }
    int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) {
        perror(root);
        return 1;
    }
    long next = 0;
    for (long c = 0; c < classes; c++) {
        /* The first FILES % CLASSES classes take one file more. */
        long count = files / classes + (c < files % classes ? 1 : 0);
        char cls[32];
        snprintf(cls, sizeof(cls), "class_%04ld", c);
        if (mkdirat(rfd, cls, 0755) != 0 && errno != EEXIST) {
            perror(cls);
            return 1;
        }
        int dfd = openat(rfd, cls, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int rc = dfd < 0 ? -errno : s_fill(dfd, next, count, copies);
        if (dfd >= 0)
            close(dfd);
        if (rc < 0) {
            fprintf(stderr, "folder_tree: '%s/%s': %s\n", root, cls,
                    strerror(-rc));
            return 1;
        }
        next += count;
    }
    close(rfd);
    printf("%ld files in %ld classes under %s\n", next, classes, root);
    return 0;
}
