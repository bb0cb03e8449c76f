"""bench/train_meter.py: the steady-state meter of bench/train_input's clients.

Both training-input clients (bench/pytorch_train_loader.py and
bench/emlio_train_loader.py) call Meter.batch(n) once per batch that is in
the consumer's hands. The meter skips a warm-up window after the first batch
(worker start, slow start, the tuner's first steps), then measures over a
steady window:
  - images and seconds;
  - CPU-seconds of this process and every live descendant (the DataLoader's
    worker processes count, and the client library's decode threads);
  - CPU-seconds of the server's process tree, when cell.py tells its pid
    (EMLIO_BENCH_SERVER_PID; /proc is shared across network namespaces);
  - bytes received on a network device (the delay line's far TUN device in
    the client's namespace: the wire bytes, TCP/IP headers included).
Whole-run CPU (imports, worker start-up) is measured by cell.py with wait4.
"""
import os
import time

from cell import tree_cpu


def read_rx(dev):
    """Bytes received on network device dev in this namespace (None: no dev)."""
    if not dev:
        return None
    try:
        with open("/sys/class/net/%s/statistics/rx_bytes" % dev) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class Meter:
    def __init__(self, seconds, warmup_s, wire_dev=None, warm_batches=1, min_batches=1):
        """seconds: the steady window; it starts warmup_s after the first
        batch, and not before warm_batches batches arrived; it ends once
        seconds passed and min_batches batches arrived in it, or at
        3 x seconds. The batch counts matter for a DataLoader at high RTT:
        its workers deliver in waves (each worker fetches a whole batch one
        image at a time), and a window must hold more than the first wave
        and at least one whole later one."""
        self.seconds, self.warmup_s, self.wire_dev = seconds, warmup_s, wire_dev
        self.warm_batches, self.min_batches = warm_batches, min_batches
        spid = os.environ.get("EMLIO_BENCH_SERVER_PID")
        self.server_pid = int(spid) if spid else None
        self.t0 = time.monotonic()
        self.t_first = None
        self.images = 0
        self.batches = 0
        self.start = None  # snapshot at the start of the steady window
        self.end = None

    def _snap(self):
        return {"t": time.monotonic(), "images": self.images,
                "client_cpu": tree_cpu(os.getpid()),
                "server_cpu": tree_cpu(self.server_pid) if self.server_pid else None,
                "rx": read_rx(self.wire_dev)}

    def batch(self, n):
        """Counts a batch of n images; True when the run should end."""
        now = time.monotonic()
        if self.t_first is None:
            self.t_first = now
        self.images += n
        self.batches += 1
        if self.start is None:
            if now - self.t_first >= self.warmup_s and self.batches >= self.warm_batches:
                self.start = self._snap()
                self.start["batches"] = self.batches
            return False
        dt = now - self.start["t"]
        if (dt >= self.seconds and self.batches - self.start["batches"] >= self.min_batches) \
                or dt >= 3 * self.seconds:
            self.end = self._snap()
            return True
        return False

    def result(self):
        """The figures as a dict; a run that ended before its steady window
        (dataset exhausted) falls back to everything after the first batch."""
        if self.end is None:
            self.end = self._snap()
        st, en = self.start, self.end
        if st is None or en["images"] - st["images"] <= 0:
            st = {"t": self.t_first or self.t0, "images": 0, "client_cpu": None,
                  "server_cpu": None, "rx": None}
        dt = en["t"] - st["t"]
        n = en["images"] - st["images"]

        def diff(k):
            return None if st[k] is None or en[k] is None else en[k] - st[k]
        return {
            "images": self.images, "batches": self.batches,
            "first_batch_s": round((self.t_first or self.t0) - self.t0, 4),
            "steady_images": n, "steady_seconds": round(dt, 4),
            "images_per_s": round(n / dt, 2) if dt > 0 else 0.0,
            "steady_client_cpu_s": diff("client_cpu"),
            "steady_server_cpu_s": diff("server_cpu"),
            "steady_wire_bytes": diff("rx"),
        }
