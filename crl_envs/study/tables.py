"""A study's tables as Markdown and its plots as PNG (from ``study.json``'s content, never from memory)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _f(v: Any, spec: str = "+.3f") -> str:
    return "n/a" if v is None else format(v, spec)


def _pts(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f}"


def _ci(ci: Any) -> str:
    return "n/a" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{c.get(v, 0)} {v}" for v in ("coupled", "decoupled", "inconclusive", "untestable"))


def valuation_markdown(tables: Mapping[str, Any]) -> str:
    s = tables["summary"]
    pct = f"{100 * s['tau_ci_level']:g}%"
    pf = s["pool_families"]
    lines = [f"**Does individual strength predict compositional strength?** Over {len(pf)} (pool, family) units: "
             f"{_counts(s['pool_family_counts'])}. Over {s['settings']} single settings: {_counts(s['counts'])} "
             f"({s['test']}).", ""]
    if tables.get("design"):
        lines += [tables["design"]["paragraph"], ""]
    m = s.get("mean_kendall_tau_by_measure") or {}
    lines.append("Mean tau-b of individual strength against: " + ", ".join(
        f"{label} {_f(m.get(k), '+.2f')}" for k, label in (("shapley", "Shapley"), ("loo", "LOO"),
                                                           ("shapley_minus_singleton", "Shapley - individual/n"))
        if k in m) + " (Shapley contains each model's own term v({i})/n; the third column takes it out).")
    al = s.get("all", {}).get("pooled")
    if al:
        lines.append(f"Pooled over all settings (one permutation of model labels per pool, {al['pools']} pool(s)): "
                     f"sum of tau-b {al['observed']:+.2f}, p = {al['p_value']:.3g} "
                     f"({'exact' if al['exact'] else 'Monte Carlo'}; smallest attainable {al['min_p_value']:.3g}).")
    lines += ["", f"| pool | family | settings | mean tau-b [{pct} CI] | pooled p (min p) | verdict |",
              "|---|---|---|---|---|---|"]
    for c in pf:
        lines.append(f"| {c['pool']} | {c['family']} | {c['settings']} | {_f(c['kendall_tau'], '+.2f')} "
                     f"{_ci(c['tau_ci'])} | {_f(c['p_value'], '.3g')} ({c['min_p_value']:.3g}) | **{c['verdict']}** |")
    lines += ["", f"| family | settings | mean tau-b [{pct} CI] | pooled p (min p) | verdict | settings' verdicts |",
              "|---|---|---|---|---|---|"]
    for fam, c in s["families"].items():
        lines.append(f"| {fam} | {c['settings']} | {_f(c['kendall_tau'], '+.2f')} {_ci(c['tau_ci'])} | "
                     f"{_f(c['p_value'], '.3g')} ({c['min_p_value']:.3g}) | {c['verdict']} | {_counts(c['counts'])} |")
    a = s.get("loo_vs_shapley")
    if a:
        lines += ["", f"LOO vs exact Shapley over {a['settings']} settings: mean Kendall tau-b "
                      f"{_f(a['mean_kendall_tau'], '+.2f')}, same top model in {a['same_top_model']} of {a['settings']}, "
                      f"LOO's mean absolute error {a['mean_abs_error']:.3f} (largest {a['max_abs_error']:.3f})."]
    lines += ["", f"| pool | protocol (family) | task | n | v(N) | model: individual / LOO / Shapley | "
                  f"tau-b Shapley [{pct} CI] | tau-b LOO | tau-b Shapley - ind./n | p (min p) | power at tau 0.5 | "
                  f"verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for st in tables["settings"]:
        models = "; ".join(f"{m} {st['individual'][m]:.2f} / {st['loo'][m]:+.3f} / "
                           f"{'n/a' if st['shapley'] is None else format(st['shapley'][m], '+.3f')}"
                           for m in st["models"])
        ms = st["measures"]
        sh = ms.get("shapley")
        taus = (f"{_f(sh['kendall_tau'], '+.2f')} {_ci(sh['tau_ci'])}" if sh else "n/a",
                f"{_f(ms['loo']['kendall_tau'], '+.2f')} {_ci(ms['loo']['tau_ci'])}",
                _f(ms["shapley_minus_singleton"]["kendall_tau"], "+.2f") if "shapley_minus_singleton" in ms else "n/a")
        lines.append(f"| {st['pool']} | {st['protocol']} ({st['family']}) | {st['task']} | {st['n']} | "
                     f"{st['system']:.3f} | {models} | {' | '.join(taus)} | {_f(st['p_value'], '.3g')} "
                     f"({st['min_p_value']:.3g}) | {st['power']['value']:.2f} | {st['verdict']} |")
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
