"""A study's tables as Markdown and its plots as PNG (from ``study.json``'s content, never from memory)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _f(v: Any, spec: str = "+.3f") -> str:
    return "n/a" if v is None else format(v, spec)


def _pts(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f}"


def valuation_markdown(tables: Mapping[str, Any]) -> str:
    s = tables["summary"]
    lines = [f"**Individual strength does not predict compositional strength in {s['uncorrelated']} of "
             f"{s['settings']} settings** ({s['test']}"
             + (f"; {s['constant_rankings']} setting(s) with a constant ranking not counted" if s["constant_rankings"]
                else "") + ").", ""]
    if s.get("pooled"):
        p = s["pooled"]
        lines.append(f"Pooled over all settings (stratified permutation test, {p['statistic']} = {p['observed']:+.2f}): "
                     f"p = {p['p_value']:.3g} ({'exact' if p['exact'] else 'Monte Carlo'}).")
        lines.append("")
    lines += ["| family | uncorrelated / settings | mean tau-b | pooled p |", "|---|---|---|---|"]
    for fam, c in s["families"].items():
        pooled = c.get("pooled")
        lines.append(f"| {fam} | {c['uncorrelated']} / {c['settings']} | {_f(c['mean_kendall_tau'], '+.2f')} | "
                     f"{'n/a' if not pooled else format(pooled['p_value'], '.3g')} |")
    lines += ["", "| pool | family | uncorrelated / settings | mean tau-b | pooled p |", "|---|---|---|---|---|"]
    for c in s["pool_families"]:
        pooled = c.get("pooled")
        lines.append(f"| {c['pool']} | {c['family']} | {c['uncorrelated']} / {c['settings']} | "
                     f"{_f(c['mean_kendall_tau'], '+.2f')} | {'n/a' if not pooled else format(pooled['p_value'], '.3g')} |")
    a = s.get("loo_vs_shapley")
    if a:
        lines += ["", f"LOO vs exact Shapley over {a['settings']} settings: mean Kendall tau-b "
                      f"{_f(a['mean_kendall_tau'], '+.2f')}, same top model in {a['same_top_model']} of {a['settings']}, "
                      f"LOO's mean absolute error {a['mean_abs_error']:.3f} (largest {a['max_abs_error']:.3f})."]
    lines += ["", "| pool | protocol (family) | task | v(N) | model: individual / LOO / Shapley | tau-b (p) |",
              "|---|---|---|---|---|---|"]
    for st in tables["settings"]:
        models = "; ".join(f"{m} {st['individual'][m]:.2f} / {st['loo'][m]:+.3f} / "
                           f"{'n/a' if st['shapley'] is None else format(st['shapley'][m], '+.3f')}"
                           for m in st["models"])
        lines.append(f"| {st['pool']} | {st['protocol']} ({st['family']}) | {st['task']} | {st['system']:.3f} | "
                     f"{models} | {_f(st['kendall_tau'], '+.2f')} ({_f(st['p_value'], '.3f')}) |")
    return "\n".join(lines)


def training_markdown(tables: Mapping[str, Any], trainers: list[str]) -> str:
    s = tables["summary"]
    lines = []
    if "crl_strongest" in s:
        lines.append(f"**C-RL is the strongest collaborator in {s['crl_strongest']} of {s['settings']} settings** "
                     f"(its Δ system accuracy at least every other trainer's).")
    gains = ", ".join(f"{t} {_pts(s['mean_gain'][t])}" for t in trainers if t in s.get("mean_gain", {}))
    lines.append(f"Mean gain in points over settings: {gains}.")
    for b, r in s.get("gain_ratio", {}).items():
        if r["value"] is None:
            lines.append(f"C-RL / {b}: no ratio ({r['note']}).")
        else:
            ci = "no CI" if r["ci"] is None else f"{round(100 * s['ci_level'])}% CI [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
            lines.append(f"C-RL / {b} mean gain: {r['value']:.2f}x ({ci}).")
    if "max_gain" in s:
        m = s["max_gain"]
        lines.append(f"Largest gain: {_pts(m['value'])} points ({m['trainer']}, {m['protocol']} on {m['task']}).")
    pct = round(100 * s.get("ci_level", 0.95))
    lines += ["", "| setup | task | before | " + " | ".join(f"{t} Δ [{pct}% CI] (per seed)" for t in trainers)
              + " | winner |", "|---|---|---|" + "---|" * len(trainers) + "---|"]
    for st in tables["settings"]:
        cells = []
        for t in trainers:
            d = st["delta"].get(t)
            cells.append("n/a" if d is None else f"{_pts(d['value'])} [{_pts(d['ci'][0])}, {_pts(d['ci'][1])}] "
                         f"({'/'.join(f'{100 * x:+.0f}' for x in d['per_seed'])})")
        win = st["winner"] + (" (significant)" if st["significant"] else " (not significant)")
        lines.append(f"| {st['protocol']} | {st['task']} | {st['before']:.3f} | " + " | ".join(cells) + f" | {win} |")
    return "\n".join(lines)


def markdown(study: Mapping[str, Any]) -> str:
    """``study.md``: both tables and how they were made."""
    out = [f"# Study {study['name']}", ""]
    if study.get("valuation"):
        out += ["## Valuation: individual vs compositional strength", "", valuation_markdown(study["valuation"]), ""]
    if study.get("training"):
        out += ["## Training: Δ system accuracy per trainer (points)", "",
                training_markdown(study["training"], study["config"]["training"]["trainers"]), ""]
    run = study.get("run", {})
    if run.get("missing"):
        out += [f"**Incomplete**: {len(run['missing'])} of {run['cells']} cells have not finished; the tables cover "
                f"the finished ones only.", ""]
    elif run:
        out += [f"Cells: {run['cells']} ({run['executed']} run now, {run['cached']} from earlier runs); wall "
                f"{run['wall_seconds']:.0f} s on {run['environment']['cpus']} CPUs, load average at the end "
                f"{run['environment']['load_average']}."]
    return "\n".join(out) + "\n"


def plots(study: Mapping[str, Any], out: Path) -> list[Path]:
    """The heatmap of mean tau-b per pool x family, and a bar plot of Δ per trainer for each setup x task."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    written = []
    v = study.get("valuation")
    if v and v["summary"]["pool_families"]:
        pools = sorted({c["pool"] for c in v["summary"]["pool_families"]})
        fams = sorted({c["family"] for c in v["summary"]["pool_families"]})
        grid = np.full((len(pools), len(fams)), np.nan)
        for c in v["summary"]["pool_families"]:
            if c["mean_kendall_tau"] is not None:
                grid[pools.index(c["pool"]), fams.index(c["family"])] = c["mean_kendall_tau"]
        fig, ax = plt.subplots(figsize=(1.8 * len(fams) + 2.5, 0.7 * len(pools) + 2), layout="constrained")
        im = ax.imshow(grid, cmap="RdBu", vmin=-1, vmax=1)
        ax.set_xticks(range(len(fams)), fams, rotation=20, ha="right")
        ax.set_yticks(range(len(pools)), pools)
        for i in range(len(pools)):
            for j in range(len(fams)):
                ax.text(j, i, "n/a" if np.isnan(grid[i, j]) else f"{grid[i, j]:+.2f}", ha="center", va="center")
        fig.colorbar(im, ax=ax, label="mean Kendall tau-b (individual vs compositional)")
        ax.set_title(f"{study['name']}: does individual strength predict compositional strength?")
        path = out / "study_valuation_heatmap.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    t = study.get("training")
    if t and t["settings"]:
        trainers = study["config"]["training"]["trainers"]
        for st in t["settings"]:
            names = [n for n in trainers if n in st["delta"]]
            means = [100 * st["delta"][n]["value"] for n in names]
            err = [[100 * (st["delta"][n]["value"] - st["delta"][n]["ci"][0]) for n in names],
                   [100 * (st["delta"][n]["ci"][1] - st["delta"][n]["value"]) for n in names]]
            fig, ax = plt.subplots(figsize=(1.3 * len(names) + 2.5, 3.6), layout="constrained")
            ax.bar(range(len(names)), means, yerr=err, capsize=4,
                   color=["tab:red" if n == "crl" else "tab:gray" for n in names])
            ax.axhline(0, color="black", lw=0.8)
            ax.set_xticks(range(len(names)), names)
            ax.set_ylabel("Δ system accuracy (points)")
            ax.set_title(f"{st['protocol']} on {st['task']} (before {st['before']:.3f})")
            path = out / f"study_training_{st['protocol']}_{st['task']}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
