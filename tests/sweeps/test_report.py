"""Results report: each claim's verdict rule on hand-made sweep results, and report.py writing
docs/results.md-style pages with a figure for a collected claim and "not run yet" (with the
commands) for the others."""

import functools
import importlib.util
import json
import os

import pytest

from jaxrl_frontier.sweeps import claims as stats
from jaxrl_frontier.sweeps.claims import DOES_NOT, INCONCLUSIVE, REPRODUCES
from jaxrl_frontier.sweeps.collect import RESULTS_JSON

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLAIMS = stats.load_claims(os.path.join(REPO, "sweeps"))  # key -> Claim, one file each


@functools.cache
def claim_file(key: str):
    """The module of sweeps/claim_<key>.py: its sweep and its analysis."""
    path = os.path.join(REPO, "sweeps", f"claim_{key}.py")
    spec = importlib.util.spec_from_file_location(f"claim_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_run(config, seed, series, overrides=None, step=200, wall=10.0):
    o = {**(overrides or {}), "seed": seed}
    return dict(
        name=f"{config}-{sorted(o.items())}",
        workdir="/nowhere",
        config=f"/repo/configs/{config}.py",
        overrides=o,
        group=f"{config}-{sorted((overrides or {}).items())}",
        seed=seed,
        status="done",
        machine="test CPU, 2 cores",
        wall_seconds=wall,
        cpu_seconds=2 * wall,
        step=step,
        series={k: [[s, v] for s, v in pts] for k, pts in series.items()},
        final={k: pts[-1][1] for k, pts in series.items()},
    )


def lengths(first, last):
    return [(10, first), (20, first), (30, first), (180, last), (190, last), (200, last)]


def claim_a_runs(grpo_growth, dr_growth):
    runs = []
    for seed in range(3):
        jitter = 0.05 * seed
        for config, adv, growth in [
            ("grpo_arith", None, grpo_growth),
            ("dr_grpo_arith", None, dr_growth),
            ("dapo_arith", None, grpo_growth),
            ("grpo_arith", "rloo", grpo_growth),
        ]:
            series = {
                "eval/pass@1_greedy": [(0, 0.3), (100, 0.4 + jitter), (200, 0.5 + jitter)],
                "eval/pass@4": [(0, 0.4), (200, 0.6)],
                "rollouts/length_incorrect": lengths(3.0 + jitter, 3.0 + jitter + growth),
                "rollouts/length_correct": lengths(3.5, 3.5),
                "train/ratio_clip_frac": [(10, 0.001), (20, 0.003)],
            }
            o = {"objective.advantage": adv} if adv else {}
            runs.append(make_run(config, seed, series, o))
    return runs


@pytest.mark.parametrize(
    "grpo_growth, dr_growth, verdict",
    [(1.5, 0.0, REPRODUCES), (1.5, 1.5, DOES_NOT), (0.0, 0.0, INCONCLUSIVE)],
)
def test_claim_a_verdicts(grpo_growth, dr_growth, verdict):
    finding = claim_file("a").analyze_a(claim_a_runs(grpo_growth, dr_growth))
    assert finding.verdict == verdict, finding.reason
    assert [r["method"] for r in finding.rows] == ["GRPO", "Dr. GRPO", "DAPO", "RLOO"]
    grpo = finding.rows[0]
    # pass@1 final over seeds 0.5, 0.55, 0.6: mean 0.55, std 0.05
    assert grpo["pass@1 final"] == "0.550 ± 0.050" and grpo["seeds"] == "3"
    assert finding.curves["held-out greedy pass@1"]["GRPO"]["steps"] == [0, 100, 200]
    assert "equals GRPO's exactly in 3 of 3 seeds" in finding.notes[1]
    assert "GRPO clips 0.20% of tokens" in finding.notes[1]
    assert finding.notes[0] == (
        "12 runs of 200 steps; wall time 10 ± 0 s per run, 2.0 min in all (4.0 CPU-min)"
    )


def test_claim_b_steps_to_target():
    runs = []
    for seed in range(3):
        for config, kl in [
            ("opd_arith", [1.0, 0.8, 0.6, 0.4]),
            ("iw_opd_arith", [1.0, 0.45, 0.3, 0.2]),
        ]:
            series = {
                "opd/reverse_kl": list(zip([10, 20, 30, 40], [v + 0.01 * seed for v in kl])),
                "eval/pass@1_greedy": [(0, 0.3), (40, 0.4)],
            }
            runs.append(make_run(config, seed, series, step=40))
    finding = claim_file("b").analyze_b(runs)
    # target: half the mean first KL (1.01) = 0.505; OPD reaches it at step 40, IW-OPD at 20
    target_col = [c for c in finding.columns if c.startswith("steps to KL")][0]
    assert target_col == "steps to KL ≤ 0.505"
    assert {r["method"]: r[target_col] for r in finding.rows} == {
        "OPD": "40.000 ± 0.000",
        "IW-OPD": "20.000 ± 0.000",
    }
    assert finding.verdict == REPRODUCES
    assert claim_file("b").steps_to(runs[0], "opd/reverse_kl", 0.1) == 41.0  # never: budget + 1
    assert "logged every 10 steps" in finding.notes[-1]


def test_claim_c_d_e_rules():
    runs = []
    for seed in range(3):
        for o, final in [
            ({"objective.weight": "pg"}, 0.5),
            (
                {
                    "objective.weight": "position_window",
                    "objective.weight_kwargs.start": 0.0,
                    "objective.weight_kwargs.end": 0.3,
                },
                0.45,
            ),
            (
                {
                    "objective.weight": "position_window",
                    "objective.weight_kwargs.start": 0.7,
                    "objective.weight_kwargs.end": 1.0,
                },
                0.30,
            ),
        ]:
            series = {
                "eval/pass@1_greedy": [(0, 0.3), (200, final + 0.01 * seed)],
                "opd/reverse_kl": [(10, 1.0), (200, 0.5)],
            }
            runs.append(make_run("opd_arith", seed, series, o))
    c = claim_file("c").analyze_c(runs)
    assert [r["method"] for r in c.rows] == [
        "all tokens",
        claim_file("c").C_FIRST,
        claim_file("c").C_LAST,
    ]
    assert c.verdict == REPRODUCES
    assert not any("peaks" in n for n in c.notes)  # every curve ends at its best

    # a window that rises to 0.70 at step 100 and falls to 0.42 (+- 0.01): a peak note
    for r in runs:
        if r["overrides"].get("objective.weight_kwargs.start") == 0.0:
            s = r["seed"]
            r["series"]["eval/pass@1_greedy"] = [
                [0, 0.3],
                [100, 0.7 + 0.01 * s],
                [200, 0.42 - 0.01 * s],
            ]
    c = claim_file("c").analyze_c(runs)
    assert c.verdict == REPRODUCES  # first 30% still ends at 0.41, above the last 30%'s 0.31
    (note,) = [n for n in c.notes if "peaks" in n]
    assert note.startswith(
        f"{claim_file('c').C_FIRST}: greedy pass@1 peaks at 0.710 ± 0.010 (step 100"
    )
    assert "ends at 0.410 ± 0.010" in note

    runs = []
    for seed in range(3):
        for weight, curve in [
            ("ppo_clip", [0.3, 0.6, 0.4]),
            ("dppo", [0.3, 0.6, 0.6]),
            ("drpo", [0.3, 0.5, 0.41]),
        ]:
            pts = list(zip([0, 100, 200], [v + 0.01 * seed for v in curve]))
            runs.append(
                make_run(
                    "grpo_arith", seed, {"eval/pass@1_greedy": pts}, {"objective.weight": weight}
                )
            )
    d = claim_file("d").analyze_d(runs)
    assert {r["method"]: r["best − final pass@1"] for r in d.rows} == {
        "PPO clip": "0.200 ± 0.000",
        "DPPO": "0.000 ± 0.000",
        "DRPO": "0.090 ± 0.000",
    }
    assert d.verdict == REPRODUCES and "DPPO +" in d.reason

    runs = []
    for seed in range(3):
        for depth, entropy, gain in [(300, 0.9, 0.3), (600, 0.6, 0.2), (1200, 0.3, 0.1)]:
            series = {
                "train/entropy": [(10, entropy + 0.01 * seed), (300, 0.2)],
                "eval/pass@1_greedy": [(0, 0.3), (300, 0.3 + gain + 0.001 * seed)],
            }
            path = f"runs/sweeps/claim_e_sft/train.steps={depth}__seed={seed}--abc"
            runs.append(make_run("grpo_arith", seed, series, {"model.path": path}))
    e = claim_file("e").analyze_e(runs)
    assert [r["method"] for r in e.rows] == ["SFT 300 steps", "SFT 600 steps", "SFT 1200 steps"]
    assert e.verdict == REPRODUCES and "over 9 runs" in e.reason


def load_report():
    spec = importlib.util.spec_from_file_location(
        "report", os.path.join(REPO, "scripts", "report.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_writes_a_page_with_figures_and_not_run_claims(tmp_path):
    runs_dir = tmp_path / "runs"
    (runs_dir / "claim_a").mkdir(parents=True)
    with open(runs_dir / "claim_a" / RESULTS_JSON, "w") as f:
        json.dump(dict(runs=claim_a_runs(1.5, 0.0), groups=[]), f)
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    text = load_report().report(str(runs_dir), str(out))
    assert out.read_text() == text.rstrip() + "\n"
    assert (tmp_path / "docs" / "results" / "claim_a.png").stat().st_size > 10_000
    assert "![claim a](results/claim_a.png)" in text
    assert f"**Verdict: {REPRODUCES}.**" in text
    assert "| (a) | reproduces at this scale | 12 | 2.0 min | 4.0 min |" in text
    assert "on test CPU, 2 cores" in text
    for key in "bcdef":
        assert f"| ({key}) | not run yet | 0 | — | — |" in text
    assert "python scripts/sweep.py run sweeps/claim_e.py:sft\n" in text
    assert "python scripts/train.py --config=configs/teacher_column_addition.py" in text


def test_a_claim_with_too_few_seeds_is_not_run_yet(tmp_path):
    runs = [r for r in claim_a_runs(1.5, 0.0) if r["seed"] < 2]
    (tmp_path / "claim_a").mkdir()
    with open(tmp_path / "claim_a" / RESULTS_JSON, "w") as f:
        json.dump(dict(runs=runs, groups=[]), f)
    text = load_report().report(str(tmp_path), str(tmp_path / "results.md"))
    assert "**Verdict: not run yet** (8 runs finished)" in text


def test_a_two_stage_claim_counts_seeds_by_depth_and_its_sft_stage_time(tmp_path):
    """Claim (e): every RL run is a collect group of its own (its model.path differs), so the
    seeds are counted by the SFT depth; the SFT sweep's time is in the claim's total."""
    sft, rl = [], []
    for seed in range(3):
        for depth, entropy, gain, start in [(200, 0.9, 0.0, 0.02), (600, 0.6, 0.1, 0.2)]:
            name = f"train.steps={depth}__seed={seed}--abc"
            sft.append(make_run("sft_arith", seed, {"eval/pass@1_greedy": [(0, 0.0)]}, wall=30.0))
            series = {
                "train/entropy": [(10, entropy + 0.01 * seed), (200, 0.2)],
                "eval/pass@1_greedy": [(0, start), (200, start + gain - 0.001 * seed)],
            }
            run = make_run(
                "grpo_arith", seed, series, {"model.path": f"runs/sweeps/claim_e_sft/{name}"}
            )
            rl.append({**run, "group": run["name"]})
    for sweep, runs in [("claim_e_sft", sft), ("claim_e_rl", rl)]:
        (tmp_path / sweep).mkdir()
        with open(tmp_path / sweep / RESULTS_JSON, "w") as f:
            json.dump(dict(runs=runs, groups=[]), f)
    text = load_report().report(str(tmp_path), str(tmp_path / "results.md"))
    # 6 RL runs x 10 s + 6 SFT runs x 30 s = 4.0 min wall, twice that in CPU time
    assert "| (e) | does not reproduce at this scale | 6 | 4.0 min | 8.0 min |" in text, text
    assert "`sweeps/claim_e.py:sft` first: 6 runs, 3.0 min (6.0 CPU-min)" in text
    assert "rises with every SFT depth (SFT 200 steps 0.020, SFT 600 steps 0.200)" in text


def test_a_run_two_claims_share_counts_once_in_the_page_total(tmp_path):
    runs = claim_a_runs(1.5, 0.0)  # 12 runs of 10 s wall, 20 s CPU
    for root in ("claim_a", "claim_d"):  # the same runs (same names) behind two claims
        (tmp_path / root).mkdir()
        with open(tmp_path / root / RESULTS_JSON, "w") as f:
            json.dump(dict(runs=runs, groups=[]), f)
    text = load_report().report(str(tmp_path), str(tmp_path / "results.md"))
    assert "| (a) | reproduces at this scale | 12 | 2.0 min | 4.0 min |" in text
    assert "| (d) | " in text and "| 12 | 2.0 min | 4.0 min |" in text.split("| (d) |")[1]
    assert "took 2.0 min of wall time and 4.0 min of CPU time" in text  # not 4.0 and 8.0


def claim_f_runs(schedule_final, controller_final):
    runs = []
    for seed in range(3):
        for o, final in [
            ({"objective.kl_coef": 0.05}, 0.50),
            ({"schedules.objective.kl_coef": "cosine(0.05, 0.005)"}, schedule_final),
            ({"controllers.objective.kl_coef": "adaptive_kl(0.02, init=0.05)"}, controller_final),
        ]:
            series = {
                "eval/pass@1_greedy": [(0, 0.3), (100, 0.6), (200, final + 0.01 * seed)],
                "train/kl_ref": [(10, 0.01), (200, 0.04 + 0.001 * seed)],
                "train/entropy": [(10, 0.5), (200, 0.3)],  # logged, read by no claim of (f)
            }
            if "objective.kl_coef" not in o:
                series["schedule/objective.kl_coef"] = [(10, 0.05), (200, 0.005)]
            runs.append(make_run("grpo_arith", seed, series, o))
    return runs


@pytest.mark.parametrize(
    "schedule, controller, verdict, words",
    [
        (0.60, 0.50, REPRODUCES, ["cosine schedule better (+12.2 SE)", "within noise (+0.0 SE)"]),
        (0.40, 0.50, DOES_NOT, ["cosine schedule worse (-12.2 SE)"]),
        (0.60, 0.40, INCONCLUSIVE, ["better (+12.2 SE)", "adaptive controller worse"]),
        (0.505, 0.495, INCONCLUSIVE, ["within noise (+0.6 SE)", "within noise (-0.6 SE)"]),
    ],
)
def test_claim_f_verdicts(schedule, controller, verdict, words):
    f = claim_file("f").analyze_f(claim_f_runs(schedule, controller))
    assert [r["method"] for r in f.rows] == [
        claim_file("f").F_FIXED,
        claim_file("f").F_SCHEDULE,
        claim_file("f").F_CONTROLLER,
    ]
    assert f.verdict == verdict, f.reason
    for w in words:
        assert w in f.reason, f.reason
    rows = {r["method"]: r for r in f.rows}
    assert rows[claim_file("f").F_FIXED]["final pass@1"] == "0.510 ± 0.010"
    assert rows[claim_file("f").F_FIXED]["best pass@1"] == "0.600 ± 0.000"
    assert rows[claim_file("f").F_FIXED]["kl_coef first → last"] == "0.050 (fixed)"
    assert rows[claim_file("f").F_SCHEDULE]["kl_coef first → last"] == "0.050 → 0.005 ± 0.000"
    assert rows[claim_file("f").F_SCHEDULE]["pass@1 start"] == "0.300 ± 0.000"
    assert rows[claim_file("f").F_FIXED]["final KL to the SFT policy"] == "0.041 ± 0.001"


def test_trimmed_runs_give_the_same_findings():
    """report.trim keeps every curve a claim reads: each analysis on trimmed runs equals the
    one on the full records, and the curves no claim reads are gone."""
    trim = load_report().trim
    for analyze, runs in [
        (claim_file("a").analyze_a, claim_a_runs(1.5, 0.0)),
        (claim_file("f").analyze_f, claim_f_runs(0.6, 0.5)),
    ]:
        trimmed = trim(runs)
        assert analyze(trimmed) == analyze(runs)
        assert "workdir" not in trimmed[0] and "final" not in trimmed[0]
    assert "train/entropy" in claim_f_runs(0.6, 0.5)[0]["series"]
    assert "eval/other" not in trim([make_run("x", 0, {"eval/other": [(1, 1.0)]})])[0]["series"]


def test_the_page_rebuilds_from_the_committed_data_and_keeps_sections_without_data(tmp_path):
    """With the collected runs on the machine, report writes their trimmed copy to the data
    dir; from that copy alone (a fresh clone) it writes the same page. A claim with a section
    on the page but no data keeps that section, marked once; its row and time stay."""
    report = load_report()
    runs_dir, data, docs = tmp_path / "runs", tmp_path / "data", tmp_path / "docs"
    (runs_dir / "claim_f").mkdir(parents=True)
    with open(runs_dir / "claim_f" / RESULTS_JSON, "w") as f:
        json.dump(dict(runs=claim_f_runs(0.6, 0.5), groups=[]), f)
    docs.mkdir()
    page = docs / "results.md"
    page.write_text(
        "# old\n\n| (b) | inconclusive | 6 | 71.0 min | 36.2 min |\n\n"
        "## (b) OPD vs IW-OPD\n\n**Claim.** as written before.\n\n**Verdict: inconclusive.** x.\n"
    )
    first = report.report(str(runs_dir), str(page), str(data))
    assert json.load(open(data / "claim_f.json"))["runs"] == report.trim(claim_f_runs(0.6, 0.5))
    assert "| (f) | reproduces at this scale | 9 | 1.5 min | 3.0 min |" in first
    assert "| (b) | inconclusive | 6 | 71.0 min | 36.2 min |" in first
    section_b = first.split("## (b)")[1].split("## (c)")[0]
    assert report.FROZEN in section_b and "**Claim.** as written before." in section_b
    assert "took 72.5 min of wall time" in first and "except in the sections kept" in first
    (docs / "results" / "claim_f.png").unlink()
    again = report.report(str(tmp_path / "fresh_clone_has_no_runs"), str(page), str(data))
    assert again == first and again.count(report.FROZEN) == 1
    assert (docs / "results" / "claim_f.png").stat().st_size > 10_000


def test_the_committed_results_page_is_what_report_writes(tmp_path):
    """docs/results.md is what scripts/report.py writes from the repository alone: no runs/,
    the committed trimmed runs of docs/results/data, the page's kept sections."""
    committed = open(os.path.join(REPO, "docs", "results.md")).read()
    out = tmp_path / "results.md"
    out.write_text(committed)
    data = os.path.join(REPO, "docs", "results", "data")
    text = load_report().report(str(tmp_path / "no_runs"), str(out), data)
    assert text.rstrip() + "\n" == committed
    with_data = [
        c.key
        for c in CLAIMS.values()
        if os.path.exists(os.path.join(data, c.roots("")[-1] + ".json"))
    ]
    assert with_data, "no claim's trimmed runs are committed"
    for key in with_data:
        assert (tmp_path / "results" / f"claim_{key}.png").exists(), key


def test_a_claim_file_holds_each_stage_of_its_sweep():
    """sweeps/claim_e.py holds both stages (FILE:STAGE), each run under its own name."""
    from jaxrl_frontier.sweeps import SweepError, load_sweep
    from jaxrl_frontier.sweeps.spec import sweep_name

    path = os.path.join(REPO, "sweeps", "claim_e.py")
    sft, rl = load_sweep(f"{path}:sft"), load_sweep(f"{path}:rl")
    assert sorted((r["train.steps"], r["seed"]) for r in sft) == [
        (d, s) for d in (200, 600, 1800) for s in range(3)
    ]
    assert len(rl) == 9 and {r["seed"] for r in rl} == {0, 1, 2}
    assert all(r["model.path"].startswith("runs/sweeps/claim_e_sft/train.steps=") for r in rl)
    assert [sweep_name(s) for s in CLAIMS["e"].sweeps] == ["claim_e_sft", "claim_e_rl"]
    assert sweep_name("sweeps/claim_a.py") == "claim_a"
    with pytest.raises(SweepError, match="unknown stage 'x'"):
        load_sweep(f"{path}:x")
    assert list(CLAIMS) == list("abcdef")


def test_report_draws_a_pbt_lineage(tmp_path):
    """`report.py --lineage WORKDIR`: one arrow per lineage row, the values as its label."""
    rows = [
        dict(step=2, member=0, copied_from=3, values={"objective.kl_coef": 0.04}),
        dict(step=4, member=1, copied_from=0, values={"objective.kl_coef": 0.05}),
    ]
    (tmp_path / "lineage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "population.json").write_text(
        json.dumps({"members": [{"seed": i} for i in range(4)]})
    )
    import matplotlib.pyplot as plt

    drawn = {}
    save = plt.Figure.savefig

    def spy(fig, path, **kw):  # the figure's arrows and labels, as drawn
        ax = fig.axes[0]
        drawn["arrows"] = [(a.xy, a.xyann) for a in ax.texts if hasattr(a, "xyann")]
        drawn["labels"] = [t.get_text() for t in ax.texts if not hasattr(t, "xyann")]
        return save(fig, path, **kw)

    plt.Figure.savefig = spy
    try:
        assert load_report().main(["--lineage", str(tmp_path)]) == 0
    finally:
        plt.Figure.savefig = save
    assert os.path.getsize(tmp_path / "lineage.png") > 0
    assert drawn["arrows"] == [((2, 0), (2, 3)), ((4, 1), (4, 0))]
    assert drawn["labels"] == ["kl_coef=0.04", "kl_coef=0.05"]
