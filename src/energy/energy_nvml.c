/* energy_nvml.c - GPU energy from NVIDIA NVML, loaded with dlopen at run
 * time so that libemlio neither links against nor requires the driver.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <dlfcn.h>

#include "energy.h"

/* The few NVML declarations used, from nvml.h (return 0 is NVML_SUCCESS;
 * nvmlDevice_t is an opaque pointer). */
typedef int s_nvml_ret_t;
typedef s_nvml_ret_t s_init_fn(void);
typedef s_nvml_ret_t s_count_fn(unsigned int *count);
typedef s_nvml_ret_t s_handle_fn(unsigned int index, void **device);
typedef s_nvml_ret_t s_energy_fn(void *device, unsigned long long *mj);
typedef const char *s_errstr_fn(s_nvml_ret_t rc);

struct emlio__nvml {
    void *dl;
    s_init_fn *init;
    s_count_fn *count;
    s_handle_fn *handle;
    s_energy_fn *energy;
    s_init_fn *shutdown;
    s_errstr_fn *errstr; /* optional */
};

/* An upper bound on GPUs per node, so a broken library cannot make us
 * loop for long. */
#define S_MAX_GPUS 64

static const char *
s_errstr(const emlio__nvml_t *nvml, s_nvml_ret_t rc)
{
    const char *text = nvml->errstr ? nvml->errstr(rc) : NULL;
    return text ? text : "unknown NVML error";
}

/* dlsym into a function pointer without the object/function pointer cast
 * warning. */
static void *
s_sym(void *dl, const char *name)
{
    dlerror();
    return dlsym(dl, name);
}

int
emlio__energy_nvml_probe(const char *path, emlio__nvml_t **nvml_p,
                         emlio__energy_set_t *set, char *err)
{
    assert(nvml_p && !*nvml_p);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        return emlio__seterr(err, EMLIO_ENOTFOUND, "cannot load '%s': %s", path,
                             why ? why : "dlopen failed");
    }
    emlio__nvml_t *nvml = emlio_calloc(1, sizeof(*nvml));
    if (!nvml) {
        dlclose(dl);
        return emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
    }
    nvml->dl = dl;
    static const char *const names[] = { "nvmlInit_v2", "nvmlDeviceGetCount_v2",
                                         "nvmlDeviceGetHandleByIndex_v2",
                                         "nvmlDeviceGetTotalEnergyConsumption",
                                         "nvmlShutdown" };
    void *syms[EMLIO_ARRAY_SIZE(names)];
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(names); i++) {
        syms[i] = s_sym(dl, names[i]);
        if (!syms[i]) {
            emlio_free(nvml);
            dlclose(dl);
            return emlio__seterr(err, EMLIO_EFORMAT,
                                 "cannot use '%s': it lacks %s", path,
                                 names[i]);
        }
    }
    /* POSIX guarantees that dlsym's void * converts to a function pointer;
     * memcpy keeps -Wpedantic quiet about it. */
    memcpy(&nvml->init, &syms[0], sizeof(void *));
    memcpy(&nvml->count, &syms[1], sizeof(void *));
    memcpy(&nvml->handle, &syms[2], sizeof(void *));
    memcpy(&nvml->energy, &syms[3], sizeof(void *));
    memcpy(&nvml->shutdown, &syms[4], sizeof(void *));
    void *errstr = s_sym(dl, "nvmlErrorString");
    if (errstr)
        memcpy(&nvml->errstr, &errstr, sizeof(void *));

    s_nvml_ret_t nrc = nvml->init();
    if (nrc != 0) {
        emlio__seterr(err, EMLIO_ENOTFOUND, "nvmlInit_v2 failed: %s (%d)",
                      s_errstr(nvml, nrc), nrc);
        emlio_free(nvml);
        dlclose(dl);
        return EMLIO_ENOTFOUND;
    }
    unsigned int count = 0;
    nrc = nvml->count(&count);
    if (nrc != 0)
        count = 0;
    if (count > S_MAX_GPUS)
        count = S_MAX_GPUS;

    size_t first = set->n;
    int rc = 0;
    char note[EMLIO_ERRMSG_LEN] = "";
    for (unsigned int i = 0; i < count; i++) {
        void *device = NULL;
        unsigned long long mj = 0;
        nrc = nvml->handle(i, &device);
        if (nrc == 0)
            nrc = nvml->energy(device, &mj);
        if (nrc != 0) {
            /* Pre-Volta GPUs answer NOT_SUPPORTED: skip, keep the reason. */
            size_t used = strlen(note);
            snprintf(note + used, sizeof(note) - used,
                     "%sgpu-%u has no energy counter: %s", used ? "; " : "", i,
                     s_errstr(nvml, nrc));
            continue;
        }
        emlio__energy_counter_t *c = emlio__energy_set_add(set);
        if (!c) {
            rc = emlio__seterr(err, EMLIO_ENOMEM, "out of memory");
            break;
        }
        snprintf(c->name, sizeof(c->name), "gpu-%u", i);
        c->source = "nvml";
        c->kind = EMLIO__ENERGY_NVML;
        c->device = device;
        c->unit_j = 1e-3; /* NVML counts millijoules since driver load */
        c->in_total = true;
        c->prev = (uint64_t)mj;
    }
    if (rc == 0 && set->n == first)
        rc = emlio__seterr(err, EMLIO_ENOTFOUND,
                           "no GPU with an energy counter in '%s'%s%s", path,
                           note[0] ? ": " : "", note);
    if (rc < 0) {
        set->n = first;
        emlio__energy_nvml_close(&nvml);
        return rc;
    }
    emlio__seterr(err, 0, "%s", note);
    *nvml_p = nvml;
    return (int)(set->n - first);
}

int
emlio__energy_nvml_read(emlio__nvml_t *nvml, void *device, uint64_t *raw)
{
    unsigned long long mj = 0;
    if (!nvml || nvml->energy(device, &mj) != 0)
        return EMLIO_EPROTO;
    *raw = (uint64_t)mj;
    return 0;
}

void
emlio__energy_nvml_close(emlio__nvml_t **nvml_p)
{
    if (!nvml_p || !*nvml_p)
        return;
    emlio__nvml_t *nvml = *nvml_p;
    nvml->shutdown();
    dlclose(nvml->dl);
    emlio_free(nvml);
    *nvml_p = NULL;
}
