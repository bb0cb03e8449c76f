#!/usr/bin/python3
"""bench/cold_plot.py CSV PNG DATA_BYTES: the figure of bench/cold.sh.

MB/s against dataset size / memory (the sweep section: 0.5x, 1x, 2x, 5x) for
emlio's defaults and the PyTorch DataLoader, with the device's ceilings from
the fio section as lines. Without a sweep section, nothing is drawn."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    sweep = [r for r in rows if r["section"] == "sweep"]
    if not sweep:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for loader, label, style in (("emlio", "emlio (defaults: --io auto)", "o-"),
                                 ("pytorch", "PyTorch DataLoader, 8 workers", "s--")):
        pts = sorted((float(r["cell"].split()[0][1:]), float(r["mb_per_s"]))
                     for r in sweep if r["loader"] == loader)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    for r in rows:
        if r["section"] == "fio" and ("QD16 direct" in r["cell"] or r["cell"].startswith("seq")):
            ax.axhline(float(r["mb_per_s"]), color="grey", linestyle=":", linewidth=1)
            ax.annotate("fio " + r["cell"], (0.5, float(r["mb_per_s"])), fontsize=7,
                        va="bottom", color="grey")
    ax.set_xscale("log")
    ax.set_xticks([0.5, 1, 2, 5])
    ax.set_xticklabels(["0.5x", "1x", "2x", "5x"])
    ax.set_xlabel("dataset size / memory the daemon may use (cgroup limit)")
    ax.set_ylabel("MB/s delivered, cold page cache, 2 epochs")
    ax.set_ylim(bottom=0)
    ax.set_title("Uniform shuffle, %.1f GB of ~110 KB images, loopback" % (float(sys.argv[3]) / 1e9),
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
