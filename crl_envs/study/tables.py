"""A study's tables as Markdown and its plots as PNG (from ``study.json``'s content, never from memory)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crl_envs.stats import interval


def _f(v: Any, spec: str = "+.3f") -> str:
    return "n/a" if v is None else format(v, spec)


def _pts(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f}"


def _ci(entry: Mapping[str, Any]) -> str:
    """A tau's interval (:func:`crl_envs.stats.crossfit_tau`); zero width there means every pair was ordered."""
    return interval(entry.get("tau_ci"), entry.get("kendall_tau"), lambda v: f"{v:+.2f}",
                    undefined=entry.get("undefined"), zero_width="every pair's order determined: tau is exact")


def _counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{c.get(v, 0)} {v}" for v in ("coupled", "decoupled", "heterogeneous", "inconclusive", "untestable")
                     if v != "heterogeneous" or c.get(v))


def _power(p: Mapping[str, Any] | None) -> str:
    from crl_envs.stats import format_power

    return "n/a" if p is None else format_power(p)


def design_markdown(valuation: Mapping[str, Any] | None, training: Mapping[str, Any] | None = None) -> list[str]:
    """What the design can show, as the dry run and the report print it: per valuation pool and question
    count the power of the verdict (:func:`crl_envs.study.stats.valuation_design`), and the training
    summary's power for C-RL - placebo (:func:`crl_envs.study.stats.training_power`)."""
    lines: list[str] = []
    if valuation:
        tc, td = valuation["power_taus"]["coupled"], valuation["power_taus"]["decoupled"]
        lines += [f"| valuation pool | models | questions | settings | smallest p | coupled at tau {tc:g}: graded | "
                  f"close | decoupled at tau {td:g}: graded | close |", "|---|---|---|---|---|---|---|---|---|"]
        sims = set()
        for p in valuation["pools"]:
            pw = p["power"]
            cells = ["n/a (the task sets no question count)"] * 4 if pw is None else [
                _power(pw[v][k]) for v in ("coupled", "decoupled") for k in ("graded", "close")]
            sims |= set() if pw is None else {pw[v][k]["sims"] for v in pw for k in ("graded", "close")} - {0}
            lines.append(f"| {p['pool']} | {p['n']} | {p['questions'] or 'unknown'} | {p['settings']} | "
                         f"{p['min_p_value']:.3g} | " + " | ".join(cells) + " |")
        spacing = "; ".join(f"{k}: accuracies {v['individual'][0]:g} to {v['individual'][1]:g}, compositional means "
                            f"{v['compositional'][0]:+g} to {v['compositional'][1]:+g}, noise {v['noise']:g} per "
                            f"question" for k, v in valuation["planted_pools"].items())
        lines += ["", f"Power: the share of {', '.join(map(str, sorted(sims))) or 'no'} simulated settings per figure "
                      f"(seed 0) that the study's own verdict calls coupled (or decoupled), ± one Monte Carlo SE; "
                      f"{valuation['planting']}. Spacings ({spacing}).", "", valuation["paragraph"]]
    if training:
        t = training
        studies = f"{t['sims']} simulated studies; " if t["sims"] else ""
        lines += ["", f"Training: power {_power(t)} to call C-RL better than {t['against']} across {t['settings']} "
                      f"setting(s) (if every one passes its gates) at a true difference of {100 * t['difference']:+g} "
                      f"points, {t['seeds']} seeds, {t['questions']} evaluation questions: the summary's t-test over "
                      f"setting means, Holm over {t['baselines']} baselines (the others planted at no difference); "
                      f"{studies}"
                      f"a setting's mean difference planted with SD {100 * t['setting_mean_sd']:.2f} points (settings' "
                      f"SD {100 * t['planting']['setting_sd']:g}, seeds' {100 * t['planting']['seed_sd']:g}, the two "
                      f"systems answering {100 * t['planting']['disagreeing_share']:g}% of questions differently)."]
    return lines


def valuation_markdown(tables: Mapping[str, Any]) -> str:
    s = tables["summary"]
    pct = f"{100 * s['tau_ci_level']:g}%"
    pf = s["pool_families"]
    lines = [f"**Does individual strength predict compositional strength?** Over {len(pf)} (pool, family) units: "
             f"{_counts(s['pool_family_counts'])}. Over {s['settings']} single settings: {_counts(s['counts'])} "
             f"({s['test']}).", ""]
    if tables.get("design"):
        lines += [*design_markdown(tables["design"]), ""]
    m = s.get("mean_kendall_tau_by_measure") or {}
    lines.append("Mean tau-b of individual strength against: " + ", ".join(
        f"{label} {_f(m.get(k), '+.2f')}" for k, label in (("shapley", "Shapley"), ("loo", "LOO"),
                                                           ("shapley_minus_singleton", "Shapley - individual/n"))
        if k in m) + " (cross-fit: individual strength on one half of the questions, compositional on the other; "
        "Shapley contains each model's own term v({i})/n; the third column takes it out).")
    same = (s.get("same_questions") or {}).get("mean_kendall_tau")
    if same is not None:
        lines.append(f"On the same questions (the paper's way of measuring, not a verdict: shared question noise "
                     f"raises both measures) the mean tau-b against Shapley is {same:+.2f}.")
    al = s.get("all", {}).get("pooled")
    if al:
        lines.append(f"Pooled over all settings (one permutation of model labels per pool, {al['pools']} pool(s)): "
                     f"sum of tau-b {al['observed']:+.2f}, p = {al['p_value']:.3g} "
                     f"({'exact' if al['exact'] else 'Monte Carlo'}; smallest attainable {al['min_p_value']:.3g}).")
    lines += ["", f"| pool | family | settings | mean tau-b [{pct} CI] | pooled p (min p) | verdict |",
              "|---|---|---|---|---|---|"]
    for c in pf:
        lines.append(f"| {c['pool']} | {c['family']} | {c['settings']} | {_f(c['kendall_tau'], '+.2f')} "
                     f"{_ci(c)} | {_f(c['p_value'], '.3g')} ({c['min_p_value']:.3g}) | **{c['verdict']}** |")
    lines += ["", f"| family | settings | mean tau-b [{pct} CI] | pooled p (min p) | verdict | settings' verdicts |",
              "|---|---|---|---|---|---|"]
    for fam, c in s["families"].items():
        lines.append(f"| {fam} | {c['settings']} | {_f(c['kendall_tau'], '+.2f')} {_ci(c)} | "
                     f"{_f(c['p_value'], '.3g')} ({c['min_p_value']:.3g}) | {c['verdict']} | {_counts(c['counts'])} |")
    a = s.get("loo_vs_shapley")
    if a:
        lines += ["", f"LOO vs exact Shapley over {a['settings']} settings: mean Kendall tau-b "
                      f"{_f(a['mean_kendall_tau'], '+.2f')}, same top model in {a['same_top_model']} of {a['settings']}, "
                      f"LOO's mean absolute error {a['mean_abs_error']:.3f} (largest {a['max_abs_error']:.3f})."]
    lines += ["", f"| pool | protocol (family) | task | n | v(N) | model: individual / LOO / Shapley | "
                  f"tau-b Shapley [{pct} CI] | tau-b LOO | tau-b Shapley - ind./n | p (min p) | "
                  f"verdict | same-question tau-b Shapley (paper) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for st in tables["settings"]:
        models = "; ".join(f"{m} {st['individual'][m]:.2f} / {st['loo'][m]:+.3f} / "
                           f"{'n/a' if st['shapley'] is None else format(st['shapley'][m], '+.3f')}"
                           for m in st["models"])
        ms = st["measures"]
        sh = ms.get("shapley")
        taus = (f"{_f(sh['kendall_tau'], '+.2f')} {_ci(sh)}" if sh else "n/a",
                f"{_f(ms['loo']['kendall_tau'], '+.2f')} {_ci(ms['loo'])}",
                _f(ms["shapley_minus_singleton"]["kendall_tau"], "+.2f") if "shapley_minus_singleton" in ms else "n/a")
        lines.append(f"| {st['pool']} | {st['protocol']} ({st['family']}) | {st['task']} | {st['n']} | "
                     f"{st['system']:.3f} | {models} | {' | '.join(taus)} | {_f(st['p_value'], '.3g')} "
                     f"({st['min_p_value']:.3g}) | {st['verdict']} | "
                     f"{_f(st['measures'][st['compositional']]['same_questions']['kendall_tau'], '+.2f')} |")
    if s.get("sequential"):
        lines += ["", *sequential_markdown(tables["settings"], s["sequential"])]
    return "\n".join(lines)


def sequential_markdown(settings: list[Mapping[str, Any]], total: Mapping[str, Any]) -> list[str]:
    """Per sequential setting the questions used and the look its verdict came at; then the question x coalition
    evaluations of all of them against the fixed design's."""
    lines = ["Sequential design ([valuation.sequential], crl_envs.sequential): each setting played look by look, "
             "stopped when its verdict was decided.", "",
             "| pool | protocol | task | verdict | look | questions used | stopped | evaluations (fixed) |",
             "|---|---|---|---|---|---|---|---|"]
    for st in settings:
        q = st.get("sequential")
        if q:
            lines.append(f"| {st['pool']} | {st['protocol']} | {st['task']} | {q['verdict']} | {q['look'] + 1} of "
                         f"{len(q['looks'])} | {q['questions']} of {q['looks'][-1]} | {q['stopped']} | "
                         f"{q['evaluations']:,} ({q['fixed_evaluations']:,}) |")
    saving = f"{total['saving']:.2f}x fewer" if total["saving"] else "none"
    lines += ["", f"Question x coalition evaluations: {total['evaluations']:,} against the fixed design's "
                  f"{total['fixed_evaluations']:,} ({saving}); questions {total['questions']:,} of "
                  f"{total['fixed_questions']:,} over {total['settings']} settings; stopped: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(total["stopped"].items())) + "."]
    return lines


def _ci_pts(ci: Any, estimate: Any) -> str:
    return interval(ci, estimate, _pts)


def _p(p: Any) -> str:
    return "n/a" if p is None else format(p, ".3g")


def training_markdown(tables: Mapping[str, Any], trainers: list[str]) -> str:
    s = tables["summary"]
    pct = round(100 * s.get("ci_level", 0.95))
    lines = []
    sweep = tables.get("lr_sweep")
    if sweep:
        r = sweep["rule"]
        lines.append(f"**Learning rate, chosen before the comparison** ([training.lr_rule]: {r['trainer']} on seed "
                     f"{r['seed']} at {', '.join(f'{x:g}' for x in r['candidates'])}, the learner alone scored on {r['n']} "
                     f"{r['split']} questions drawn with seed {r['task_seed']}, rule {r['select']}): " + "; ".join(
                         f"{k}: " + ", ".join(f"lr {lr} {v['before']:.3f} -> {v['after']:.3f}" for lr, v in c["sweep"].items())
                         + (f" -> lr {c['learning_rate']:g} ({c['reason']})" if "learning_rate" in c else "")
                         for k, c in sweep["settings"].items()) + ".")
        lines.append("")
    if tables.get("pilot"):
        lines += pilot_markdown(tables["pilot"])
    seeds = "/".join(str(n) for n in s.get("seeds", []))
    comparable = s.get("comparable_settings", s["settings"])
    if "crl_vs" in s:
        lines += [f"**C-RL against each baseline** over the {comparable} comparable of {s['settings']} settings "
                  f"(setup x task), {seeds} seed(s) each, every trainer with the setup's budget and learning rate. A win "
                  f"is a larger mean Δ system accuracy; equal Δs are ties; *significant*: {s['per_setting_test']}, "
                  f"p < {s['alpha']:g}. Across: {s['across_test']}.", "",
                  "| baseline | wins / ties / losses | significant wins / losses | identical outcomes | "
                  "across settings: mean C-RL - baseline, p (Holm) | C-RL / baseline mean gain |",
                  "|---|---|---|---|---|---|"]
        for b, c in s["crl_vs"].items():
            if not c["settings"]:
                lines.append(f"| {b} | not comparable in any of {c['not_comparable']} settings (gates below) | | | | |")
                continue
            a, r = c["across"], c["ratio"]
            ratio = (f"{r['value']:.2f}x {pct}% CI {interval(r['ci'], r['value'], lambda v: f'{v:.2f}')}"
                     if r["value"] is not None else
                     f"difference {_pts(r['difference']['value'])} points "
                     f"{_ci_pts(r['difference']['ci'], r['difference']['value'])} (no ratio: {r['undefined']})")
            test = (f"p = {_p(a['p_value'])} (Holm {_p(a.get('p_holm'))}){' significant' if a.get('significant') else ''}"
                    if a["p_value"] is not None else f"no test: {a['undefined']}")
            lines.append(f"| {b} | {c['wins']} / {c['ties']} / {c['losses']} of {c['settings']} | "
                         f"{c['significant_wins']} / {c['significant_losses']} ({c['tested']} tested) | "
                         f"{c['identical_outcomes']} | {_pts(a['mean'])} points over {a['units']} setting(s), {test} | "
                         f"{ratio} |")
        lines.append("")
    for nc in s.get("not_comparable", []):
        lines.append(f"Not comparable, left out of every summary: {nc['protocol']} on {nc['task']} ({nc['reason']}).")
    if s.get("not_comparable"):
        lines.append("")
    if tables.get("design"):  # the power the dry run stated before anything trained
        lines += [*design_markdown(None, tables["design"])[1:], ""]
    lines += _gates_markdown(tables["settings"], trainers)
    for f in s.get("learner_collapse", []):
        lines.append(f"**Flag: the learner's own answers collapse** in {f['protocol']} on {f['task']} ({f['trainer']}): "
                     f"the system gains {_pts(f['system_delta'])} points while the learner alone falls "
                     f"{f['learner_before']:.3f} -> {f['learner_after']:.3f}: the gain is not the learner answering "
                     f"better (rule: {s['collapse_rule']}).")
    gains = ", ".join(f"{t} {_pts(s['mean_gain'][t])} {_ci_pts(s['mean_gain_ci'][t], s['mean_gain'][t])}"
                      for t in trainers if t in s.get("mean_gain", {}))
    if gains:
        lines.append(f"Mean Δ system accuracy over the {comparable} comparable setting(s), points [{pct}% CI]: {gains}.")
        lines.append("Mean Δ of the learner's own accuracy, points: " + ", ".join(
            f"{t} {_pts(s['mean_learner_gain'][t])}" for t in trainers if t in s["mean_learner_gain"]) + ".")
    if "largest_gain" in s:
        m = s["largest_gain"]
        by = "; ".join(f"{b['trainer']}, {b['protocol']} on {b['task']}" for b in m["by"])
        lines.append(f"Largest Δ: {_pts(m['value'])} points ({by}{'; a tie' if len(m['by']) > 1 else ''}).")
    for note in s.get("notes", []):
        lines.append(f"Note: {note}.")
    lines += _trainer_rows(tables["settings"], trainers, pct)
    return "\n".join(lines + _several_markdown(tables["settings"], trainers, pct))


def pilot_markdown(pilot: Mapping[str, Any]) -> list[str]:
    """``training.pilot`` as the report prints it: the rule, and per setting the curve (rate x adapter x
    checkpoint: the learner's own and the system's validation scores, means over the pilot's seeds) and the
    choice, fixed before the comparison ran."""
    r = pilot["rule"]
    lines = [f"**Steps, learning rate and adapter, fixed by the pilot before the comparison** ([training.pilot]: "
             f"{r['trainer']} on seed(s) {', '.join(str(x) for x in r['seeds'])}, one fit per rate x adapter x seed to "
             f"{r['steps'][-1]} steps scored at {', '.join(str(x) for x in r['steps'])}, on {r['n']} {r['split']} "
             f"questions drawn with seed {r['task_seed']}, never the eval split; rule {r['select']}, tolerance "
             f"{r['tolerance']:g}, margin {r['margin']:g}).", ""]
    for key, c in pilot["settings"].items():
        choice = (f"chosen: {c['steps']} steps, lr {c['learning_rate']:g}, {c['adapter']} ({c['reason']})"
                  if "steps" in c else f"no choice yet: {c['fits']} of {c['cells']} fits finished")
        spread = any("alone_deltas" in row for row in c["curve"])  # several pilot seeds: each fit's Δ too
        lines += [f"*{key}*: {choice}.", "",
                  "| lr | adapter | steps | learner alone (before -> at steps) | system (before -> at steps) | kept |"
                  + (" learner alone Δ per pilot seed (points) |" if spread else ""),
                  "|---|---|---|---|---|---|" + ("---|" if spread else "")]
        for row in c["curve"]:
            kept = "yes" if row["kept"] else "no"
            per_seed = " ".join(f"{100 * d:+.1f}" for d in row.get("alone_deltas", []))
            lines.append(f"| {row['learning_rate']:g} | {row['adapter']} | {row['steps']} | {row['before']:.3f} -> "
                         f"{row['after']:.3f} | {row['system_before']:.3f} -> {row['system']:.3f} | {kept} |"
                         + (f" {per_seed} |" if spread else ""))
        lines.append("")
    return lines


def _trainer_rows(settings: list[Mapping[str, Any]], trainers: list[str], pct: int) -> list[str]:
    """The per setting x trainer table: Δs with their CIs, the learner alone, the comparisons and controls."""
    lines = ["", f"| setup | task | budget | trainer | Δ system [{pct}% CI] | per seed [CI] | learner alone before -> "
                  f"after per seed | Δ learner alone [CI] | per seed [CI] | C-RL - this (paired t p) | "
                  f"Δ - placebo's Δ [CI] | after - without learner [CI] | zero-variance groups |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for st in settings:
        bud = st.get("budget") or {}
        budget = f"{bud['steps']} steps, lr {bud['learning_rate']:g}" if bud else "n/a"
        for t in trainers:
            d = st["delta"].get(t)
            if d is None:
                continue
            la = st["learner_alone"]
            ld = la["delta"][t]
            per = " ".join(f"{_pts(x)} {_ci_pts(ci, x)}" for x, ci in zip(d["per_seed"], d["per_seed_ci"]))
            lper = " ".join(f"{_pts(x)} {_ci_pts(ci, x)}" for x, ci in zip(ld["per_seed"], ld["per_seed_ci"]))
            after = "/".join(f"{x:.3f}" for x in la["after"][t])
            vs = st.get("crl_vs", {}).get(t)
            versus = "" if vs is None else f"{vs['outcome']}: {_pts(vs['difference'])} (p {_p(vs['p_value'])})" + \
                (" significant" if vs["significant"] else "") + (", identical outcomes" if vs["identical_outcomes"] else "")
            name = t + (" **collapse**" if t in st["learner_collapse"] else "") + \
                (" (strongest" + (", tie)" if st["tie"] else ")") if t in st["strongest"] else "")
            placebo = st.get("vs_placebo", {}).get(t)
            vp = "" if placebo is None else f"{_pts(placebo['difference'])} {_ci_pts(placebo['ci'], placebo['difference'])}"
            wl = st.get("delta_vs_without_learner", {}).get(t)
            vw = "" if wl is None else f"{_pts(wl['value'])} {_ci_pts(wl['ci'], wl['value'])}"
            zero = st.get("signals", {}).get("zero_variance", {}).get(t)
            lines.append(f"| {st['protocol']} | {st['task']} | {budget} | {name} | {_pts(d['value'])} {_ci_pts(d['ci'], d['value'])} | "
                         f"{per} | {la['before']:.3f} -> {after} | {_pts(ld['value'])} {_ci_pts(ld['ci'], ld['value'])} | {lper} | "
                         f"{versus} | {vp} | {vw} | {'' if zero is None else f'{zero:.0%}'} |")
    return lines


def _gates_markdown(settings: list[Mapping[str, Any]], trainers: list[str]) -> list[str]:
    """Per setting its gates (:func:`crl_envs.study.gates.setting_gates`), the system without the learner, the
    zero-variance shares and the parse/verdict rates, and "not comparable: <reason>" where a gate fails."""
    lines = []
    for st in settings:
        if "gates" not in st:
            continue
        marks = "; ".join(f"{g['name']} {'passed' if g['passed'] else 'FAILED'} ({g['detail']})" for g in st["gates"])
        head = f"**Gates, {st['protocol']} on {st['task']}:** {marks}."
        if "without_learner" in st:
            head += f" System before {st['before']:.3f}, without the learner {st['without_learner']:.3f}."
        sig = st.get("signals", {})
        zero = ", ".join(f"{t} {v:.0%}" for t, v in sig.get("zero_variance", {}).items() if v is not None)
        if zero:
            head += f" Zero-variance groups: {zero}."
        rb = sig.get("rates_before") or {}
        for k, what in (("parse_rate", "parse rate"), ("verdict_rate", "verdict rate")):
            after = ", ".join(f"{t} {v[k]:.2f}" for t, v in sig.get("rates_after", {}).items() if v.get(k) is not None)
            if rb.get(k) is not None or after:
                head += f" Learner's {what} before {_f(rb.get(k), '.2f')}, after: {after or 'n/a'}."
        lines.append(head)
        if not st.get("comparable", True):
            lines.append(f"**{st['protocol']} on {st['task']}: not comparable: {st['not_comparable']}** (no wins or "
                         f"losses counted).")
    return lines + ([""] if lines else [])


def _several_markdown(settings: list[Mapping[str, Any]], trainers: list[str], pct: int) -> list[str]:
    """Each learner's own Δ beside the system's (setups with several learners), and the cross-play gaps."""
    lines = []
    several = [st for st in settings if st.get("learners_alone")]
    if several:
        lines += ["", "**Several learners:** each learner's own Δ (it answering alone) beside the system's.", "",
                  f"| setup | task | trainer | Δ system [{pct}% CI] | learner | alone before -> after per seed | "
                  f"Δ alone [{pct}% CI] | per seed [CI] |", "|---|---|---|---|---|---|---|---|"]
        for st in several:
            for t in trainers:
                if t not in st["delta"]:
                    continue
                d = st["delta"][t]
                for j, la in st["learners_alone"].items():
                    ld = la["delta"][t]
                    lper = " ".join(f"{_pts(x)} {_ci_pts(ci, x)}" for x, ci in zip(ld["per_seed"], ld["per_seed_ci"]))
                    after = "/".join(f"{x:.3f}" for x in la["after"][t])
                    lines.append(f"| {st['protocol']} | {st['task']} | {t} | {_pts(d['value'])} {_ci_pts(d['ci'], d['value'])} | "
                                 f"{j} | {la['before']:.3f} -> {after} | {_pts(ld['value'])} {_ci_pts(ld['ci'], ld['value'])} | "
                                 f"{lper} |")
    cross = [st for st in settings if st.get("crossplay")]
    if cross:
        lines += ["", "**Cross-play:** each trained learner played with its training partners and with partners it "
                      "never trained with (other coalitions; with several learners, the others untrained). A gain is "
                      "the system's accuracy with the learner trained minus untrained, same partners; gap = gain with "
                      "training partners - gain with unseen partners (mean over learners and unseen settings; a "
                      "large positive gap: it only works with its training partners).", "",
                  f"| setup | task | trainer | gain, training partners [{pct}% CI] | gain, unseen partners [CI] | "
                  f"gap [CI] | gap per learner | unseen settings | seeds |", "|---|---|---|---|---|---|---|---|---|"]
        for st in cross:
            for t in trainers:
                c = st["crossplay"].get(t)
                if c is None:
                    continue
                per = ", ".join(f"{j} {_pts(g)}" for j, g in c["learners"].items())
                lines.append(f"| {st['protocol']} | {st['task']} | {t} | "
                             + " | ".join(f"{_pts(c[k]['value'])} {_ci_pts(c[k]['ci'], c[k]['value'])}"
                                          for k in ("trained_with_gain", "unseen_gain", "gap"))
                             + f" | {per} | {c['unseen_settings']} | {len(c['seeds'])} |")
    return lines


def markdown(study: Mapping[str, Any]) -> str:
    """``study.md``: both tables and how they were made."""
    out = [f"# Study {study['name']}", ""]
    if study.get("valuation"):
        out += ["## Valuation: individual vs compositional strength", "", valuation_markdown(study["valuation"]), ""]
    if study.get("fronts"):
        from crl_envs.valuation.fronts import fronts_markdown

        out += ["## Cost-quality fronts: accuracy vs tokens over every coalition x protocol", "",
                fronts_markdown(study["fronts"]), ""]
    settings = (study.get("valuation") or {}).get("settings", [])
    if any(s.get("cost") or s.get("interactions") for s in settings):
        from crl_envs.study.costs import costs_markdown

        out += ["## Cost-aware values and pairwise interactions per setting", "", costs_markdown(settings), ""]
    if study.get("training"):
        out += ["## Training: Δ system accuracy and the learner's own Δ per trainer (points)", "",
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
    """The heatmap of mean tau-b per pool x family, a bar plot of Δ per trainer for each setup x task, and with a
    pilot its dose-response per setting."""
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
        im = ax.imshow(grid, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")  # cells fill the figure
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
            failed = [g["name"] for g in st.get("gates", []) if not g["passed"]]
            fig, ax = plt.subplots(figsize=(max(1.3 * len(names) + 2.5, 7.5 if failed else 0), 3.6),
                                   layout="constrained")
            ax.bar(range(len(names)), means, yerr=err, capsize=4,
                   color=["tab:red" if n == "crl" else "tab:gray" for n in names])
            ax.axhline(0, color="black", lw=0.8)
            ax.set_xticks(range(len(names)), names)
            ax.set_ylabel("Δ system accuracy (points)")
            verdict = f"\nnot comparable, gates failed: {', '.join(failed)}" if failed else ""
            ax.set_title(f"{st['protocol']} on {st['task']} (before {st['before']:.3f}){verdict}",
                         fontsize=9 if failed else None)
            path = out / f"study_training_{st['protocol']}_{st['task']}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    pilot = (t or {}).get("pilot")
    for key, c in (pilot or {}).get("settings", {}).items():
        if c["curve"]:
            written.append(_pilot_plot(key, c, out))
    return written


def _pilot_plot(key: str, c: Mapping[str, Any], out: Path) -> Path:
    """The pilot's dose-response for one setting: the learner alone and the system on the validation questions
    against steps (0: before training), one line per rate (colour) x adapter (solid full, dashed LoRA); hollow
    markers where the fit did not keep the learner's own accuracy, a star at the choice."""
    import matplotlib.pyplot as plt

    rates = sorted({r["learning_rate"] for r in c["curve"]}, reverse=True)
    colours = plt.get_cmap("viridis")([i / max(1, len(rates) - 1) for i in range(len(rates))])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained", sharex=True)
    for (lr, adapter), rows in _grouped(c["curve"], ("learning_rate", "adapter")).items():
        colour = colours[rates.index(lr)]
        for ax, before, after in ((axes[0], "before", "after"), (axes[1], "system_before", "system")):
            xs, ys = [0, *(r["steps"] for r in rows)], [rows[0][before], *(r[after] for r in rows)]
            ax.plot(xs, ys, color=colour, ls="-" if adapter == "full" else "--", lw=1.2,
                    label=f"lr {lr:g} {adapter}")
            for r in rows:
                ax.plot(r["steps"], r[after], "o", color=colour, mfc=colour if r["kept"] else "white", ms=5)
            if "steps" in c and (lr, adapter) == (c["learning_rate"], c["adapter"]):
                chosen = next(r for r in rows if r["steps"] == c["steps"])
                ax.plot(c["steps"], chosen[after], "*", color="black", ms=14, zorder=5)
    axes[0].set_ylabel("learner alone (validation accuracy)")
    axes[1].set_ylabel("system (validation accuracy)")
    for ax in axes:
        ax.set_xlabel("steps")
    axes[1].legend(fontsize=7, ncol=2)
    choice = (f"chosen: {c['steps']} steps, lr {c['learning_rate']:g}, {c['adapter']} (star)" if "steps" in c
              else "no choice yet")
    fig.suptitle(f"pilot, {key}: {choice}; hollow: learner not kept", fontsize=10)
    path = out / f"study_pilot_{key.replace('/', '_')}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grouped(rows: list[Mapping[str, Any]], keys: tuple[str, ...]) -> dict[tuple, list[Mapping[str, Any]]]:
    """``rows`` grouped by ``keys`` (first appearance order), each group sorted by steps."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return {k: sorted(v, key=lambda r: r["steps"]) for k, v in groups.items()}
