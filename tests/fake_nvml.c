/* fake_nvml.c - a stand-in for libnvidia-ml.so.1 with scripted energy
 * counters, so the meter's NVML path is tested on machines without a GPU.
 * SPDX-License-Identifier: MIT
 *
 * Build: cc -shared -fPIC -o libfake_nvml.so tests/fake_nvml.c
 * The test dlopens the same file to reach the fake_nvml_* controls: a
 * second dlopen of one path returns the already-loaded object, so the
 * controls and the meter see the same state.
 */
#include <stddef.h>

#define S_MAX_DEVICES 8

/* NVML return codes used here (nvml.h). */
#define S_SUCCESS        0
#define S_ERROR_UNINIT   1
#define S_INVALID_ARG    2
#define S_NOT_SUPPORTED  3
#define S_DRIVER_MISSING 9

/* Test-only global state: this file is a fake, not library code. */
static int s_init_rc = S_SUCCESS;
static unsigned s_devices = 1;
static unsigned long long s_energy[S_MAX_DEVICES];
static int s_supported[S_MAX_DEVICES] = { 1, 1, 1, 1, 1, 1, 1, 1 };
static int s_live = 0; /* inits minus shutdowns */
static unsigned s_reads = 0;

/* --- Controls for the test. --- */

void fake_nvml_reset(int init_rc, unsigned devices);
void fake_nvml_set_energy(unsigned dev, unsigned long long mj);
void fake_nvml_set_supported(unsigned dev, int supported);
int fake_nvml_live(void);
unsigned fake_nvml_reads(void);

void
fake_nvml_reset(int init_rc, unsigned devices)
{
    s_init_rc = init_rc;
    s_devices = devices > S_MAX_DEVICES ? S_MAX_DEVICES : devices;
    for (unsigned i = 0; i < S_MAX_DEVICES; i++) {
        s_energy[i] = 0;
        s_supported[i] = 1;
    }
    s_reads = 0;
}

void
fake_nvml_set_energy(unsigned dev, unsigned long long mj)
{
    if (dev < S_MAX_DEVICES)
        s_energy[dev] = mj;
}

void
fake_nvml_set_supported(unsigned dev, int supported)
{
    if (dev < S_MAX_DEVICES)
        s_supported[dev] = supported;
}

int
fake_nvml_live(void)
{
    return s_live;
}

unsigned
fake_nvml_reads(void)
{
    return s_reads;
}

/* --- The NVML symbols the meter resolves. --- */

typedef struct s_device *nvmlDevice_t;

static struct s_device {
    unsigned index;
} s_handles[S_MAX_DEVICES] = { { 0 }, { 1 }, { 2 }, { 3 },
                               { 4 }, { 5 }, { 6 }, { 7 } };

int nvmlInit_v2(void);
int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned int *count);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                        unsigned long long *energy);
const char *nvmlErrorString(int rc);

int
nvmlInit_v2(void)
{
    if (s_init_rc == S_SUCCESS)
        s_live++;
    return s_init_rc;
}

int
nvmlShutdown(void)
{
    if (s_live <= 0)
        return S_ERROR_UNINIT;
    s_live--;
    return S_SUCCESS;
}

int
nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (s_live <= 0)
        return S_ERROR_UNINIT;
    *count = s_devices;
    return S_SUCCESS;
}

int
nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (s_live <= 0)
        return S_ERROR_UNINIT;
    if (index >= s_devices)
        return S_INVALID_ARG;
    *device = &s_handles[index];
    return S_SUCCESS;
}

int
nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                    unsigned long long *energy)
{
    if (s_live <= 0)
        return S_ERROR_UNINIT;
    if (!device || device->index >= s_devices)
        return S_INVALID_ARG;
    if (!s_supported[device->index])
        return S_NOT_SUPPORTED;
    s_reads++;
    *energy = s_energy[device->index];
    return S_SUCCESS;
}

const char *
nvmlErrorString(int rc)
{
    switch (rc) {
    case S_SUCCESS:
        return "Success";
    case S_ERROR_UNINIT:
        return "Uninitialized";
    case S_INVALID_ARG:
        return "Invalid Argument";
    case S_NOT_SUPPORTED:
        return "Not Supported";
    case S_DRIVER_MISSING:
        return "Driver Not Loaded";
    default:
        return "Unknown Error";
    }
}
