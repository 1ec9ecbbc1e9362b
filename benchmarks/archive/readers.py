"""The tables of the archived studies' results files (:mod:`benchmarks.archive`), as
:mod:`benchmarks.tables`, the one writer of docs' tables, renders them: those files no longer
change, so these readers are kept, unmaintained, beside the studies that wrote them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import results_io
from benchmarks.results_io import every_file, held_isa, newest, pct, rel
from volseg.utils.units import MIB

#: the input depths docs/benchmarks.md shows of ``cpu_bf16_conv.py``'s files (they hold 1 to 4)
BF16_CONV_DEPTHS = (2,)


@newest("validation_memory")
def validation_memory(path: Path, doc: dict) -> str:
    """Validation's memory on the CPU, measured against the estimate (``validation_memory.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}):",
        "",
        "| case | volume | precision | windows | measured rise MiB | estimated MiB | error |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['case']} | {'×'.join(map(str, r['volume_shape']))} | {r['precision']} | "
            f"{r['windows']} | {r['measured_growth'] / MIB:,.1f} | "
            f"{r['estimated_growth'] / MIB:,.1f} | {pct(r['error'])} |"
        )
    return "\n".join(lines)


#: ``data_throughput.py --compare``'s loaders by their key (files of 2026-12-02 and -03 named
#: them ``MONAI:`` and ``MONAI on volseg's terms:``)
LOADER_NAMES = {
    "monai": "a ten-line MONAI loader",
    "monai_in_place": "the ten-line MONAI loader on volseg's terms",
    "volseg": "volseg",
}


@every_file(
    "loader_compare",
    "| file | machine, command | loader (1 thread, 0 workers) | build + first batch (s) "
    "| s/batch |",
    "| --- | --- | --- | ---: | ---: |",
)
def loader_compare(path: Path, doc: dict) -> list[str]:
    """volseg's loader against a ten-line MONAI loader, as written and on volseg's terms, per
    results file (``data_throughput.py --compare``). A file whose rows do not record their
    threads has the process's count before the comparison in ``settings.threads``: the
    comparison itself ran on one thread, and the table says so."""
    threads = doc.get("settings", {}).get("threads")
    note = (
        f" (ran on 1 thread, not its recorded {threads})"
        if threads not in (None, 1) and all("threads" not in r for r in doc["rows"])
        else ""
    )
    lines = []
    for r in doc["rows"]:
        what = r["label"].split(": ", 1)[-1]
        name = LOADER_NAMES.get(r.get("loader"), r["label"].split(": ", 1)[0])
        lines.append(
            f"| {rel(path)}{note} | {results_io.machine_line(doc)} | {name}: {what} | "
            f"{r['first_batch_s']:.2f} | {r['s_per_batch']:.3f} |"
        )
    return lines


@every_file(
    "step_profile",
    "| file | CPU | ISA | network | s/step | GFLOP/step | of fp32 GEMM peak | in convolutions "
    "| next largest operators |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
)
def step_profile(path: Path, doc: dict) -> list[str]:
    """A float32 training step's self CPU time by operator, per network and results file
    (``step_profile.py``): the share spent in convolutions (forward and backward) and the
    three largest other operators."""
    lines = []
    for r in doc["rows"]:
        total = r["profiled_self_s_per_step"]
        conv = [o for o in r["ops"] if "convolution" in o["op"]]
        others = [o for o in r["ops"] if "convolution" not in o["op"]][:3]
        rest = ", ".join(f"{o['op']} {o['self_s_per_step'] / total:.1%}" for o in others)
        lines.append(
            f"| {rel(path)} | {doc['cpu']} | {held_isa(doc)} | {r['network']} | "
            f"{r['seconds_per_step']:.3f} | {r['flops_per_step'] / 1e9:.1f} | "
            f"{r['of_fp32_peak']:.2f} | {sum(o['self_s_per_step'] for o in conv) / total:.0%} | "
            f"{rest} |"
        )
    return lines


@newest("network_levers")
def network_levers(path: Path, doc: dict) -> str:
    """Each lever's cut per network: measured on the CPU, estimated for a GPU
    (``network_levers.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; float32 on the CPU, a steady step's "
        f"peak rise over {doc['steps']} optimizer steps; the GPU column: the estimator's peak "
        f"allocated for {doc['gpu_estimate']}, not measured):",
        "",
        "| network | lever | CPU measured MiB | cut | CPU estimated MiB | GPU estimated MiB "
        "| cut |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        measured = r.get("cpu_measured_growth")
        cpu = (
            f"{measured / MIB:,.1f} | {r['cpu_measured_cut']:.2f}x | "
            f"{r['cpu_estimated_growth'] / MIB:,.1f}"
            if measured is not None
            else "not on a CPU | | "
        )
        lines.append(
            f"| {r['network'].split(' (')[0].split(' fp32')[0]} | {r['lever']} | {cpu} | "
            f"{r['gpu_estimated_peak'] / MIB:,.1f} | {r['gpu_estimated_cut']:.2f}x |"
        )
    return "\n".join(lines)


#: sides that a later ``real_data.py --sides ...`` file adds to a learning table
LATER_SIDES = ("nnunet_nomirror", "nnunet_own_plan")


#: nnU-Net v2's full schedule in optimizer steps: ``nnUNetTrainer``'s ``num_epochs`` (1000)
#: times its ``num_iterations_per_epoch`` (250)
NNUNET_SCHEDULE_STEPS = 1000 * 250


def side_label(side: str, rows: list[dict]) -> str:
    """What a learning table's side ran, by name: nnU-Net's rows say the share of its schedule
    they got and whose patch and network they trained; the MONAI loop given volseg's recipe is
    named as the equal-terms anchor."""
    if side.startswith("nnunet"):
        steps = sum(r["steps"] for r in rows) / len(rows)
        share = 100 * steps / NNUNET_SCHEDULE_STEPS
        # a handful of steps is still a share of the schedule, not 0.00%
        shown = f"{share:.2f}" if share >= 0.01 else f"{share:.1g}"
        plan = "its own plan" if side == "nnunet_own_plan" else "volseg's patch and network"
        label = f"nnU-Net v2's trainer, {shown}% of its schedule, {plan}"
        return label + (", no mirroring" if side == "nnunet_nomirror" else "")
    if side == "monai_volseg":
        return "MONAI loop, volseg's recipe (the equal-terms anchor)"
    return rows[0]["method"].split(" (")[0]


def _real_data_files(results: Path, data: str) -> list[Path]:
    """The newest ``real_data.py`` file of ``data`` that ran nnU-Net's recipe beside volseg,
    then the newest file of each of :data:`LATER_SIDES` run on the same terms after it: the same
    data, budget, precision and mode on the same CPU and kernels (a wall-clock budget buys
    different work on another CPU)."""
    paths = results_io.runs("real_data", "cpu", results)
    settings = {}
    for path in paths:
        doc = results_io.load(path)
        machine = {"cpu": doc.get("cpu"), "cpu_capability": doc.get("cpu_capability")}
        settings[path] = {**doc.get("settings", {}), **machine}
    base = next(
        (
            p
            for p in reversed(paths)
            if settings[p].get("data") == data and "nnunet" in settings[p].get("sides", [])
        ),
        None,
    )
    if base is None:
        return []
    terms = ("data", "budget_s", "precision", "mode", "cpu", "cpu_capability")
    later = []
    for side in LATER_SIDES:
        same = [
            p
            for p in paths[paths.index(base) + 1 :]
            if side in settings[p].get("sides", [])
            and all(settings[p].get(k) == settings[base].get(k) for k in terms)
        ]
        later += same[-1:]
    return [base, *dict.fromkeys(later)]


def learning(results: Path, data: str, per_class: bool = True) -> str | None:
    """volseg, nnU-Net's recipe at equal compute and the MONAI loop (as its tutorials, and with
    volseg's recipe) on ``data=<data>``: mean over the runs, then (``per_class``) per class
    (``real_data.py``; the results file keeps every class either way)."""
    paths = _real_data_files(results, data)
    if not paths:
        return None
    doc = results_io.load(paths[0])
    s = doc["settings"]
    rows = list(doc["rows"])
    for path in paths[1:]:
        rows += [r for r in results_io.load(path)["rows"] if r["side"] in LATER_SIDES]
    also = "".join(f" and {rel(p)}" for p in paths[1:])
    head = (
        f"{rel(paths[0])}{also} ({results_io.machine_line(doc)}; {s['budget_s']} s a run, "
        f"{s['mode']}, precision {s['precision']} on every side, seeds "
        f"{', '.join(map(str, s['seeds']))}):"
    )
    return f"{head}\n\n{learning_rows(rows, per_class)}"


def learning_rows(rows: list[dict], per_class: bool = True) -> str:
    """The learning table of ``real_data.py`` rows: per side the mean over its runs, then the
    final Dice per class (what ``real_data.py`` prints, and :func:`learning` from its files)."""
    sides = list(dict.fromkeys(r["side"] for r in rows))
    runs = {side: [r for r in rows if r["side"] == side] for side in sides}
    method = {side: side_label(side, runs[side]) for side in sides}
    # files from before the predicted labels were counted: the table as it was
    voxels = any("predicted_voxels_per_class" in r for r in rows)
    lines = [
        "| side | runs | steps (mean) | final val Dice (mean) | per run | best val Dice (mean) "
        "| classes at 0 (final) |" + (" background, of the predicted voxels |" if voxels else ""),
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |" + (" ---: |" if voxels else ""),
    ]
    for side in sides:
        rs = runs[side]
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in ("steps", "final_dice_mean")}
        best = sum(r["dice_mean"] for r in rs) / len(rs)
        each = ", ".join(f"{r['final_dice_mean']:.3f}" for r in rs)
        zeros = ", ".join(str(r["final_zero_classes"]) for r in rs)
        shares = ", ".join(background_share(r) for r in rs)
        lines.append(
            f"| {method[side]} | {len(rs)} | {mean['steps']:.0f} | {mean['final_dice_mean']:.3f} "
            f"| {each} | {best:.3f} | {zeros} |" + (f" {shares} |" if voxels else "")
        )
    if not per_class:
        return "\n".join(lines)
    lines += ["", "Final validation Dice per class, mean over the runs:", ""]
    lines.append("| class | " + " | ".join(method[side] for side in sides) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in sides) + " |")
    for c in rows[0]["per_class"]:
        cells = []
        for side in sides:
            values = [r["final_per_class"][c] for r in runs[side]]
            cells.append(f"{sum(values) / len(values):.3f}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def background_share(row: dict) -> str:
    """The share of a run's predicted voxels (its ``predicted_voxels_per_class`` over the
    scored validation cases, background first) that are background, e.g. ``97.31%`` (``100%``
    only where every voxel is); ``-``
    where the row has no count. 100.0% with a Dice of 0 on every class: a collapse to
    background."""
    counts = row.get("predicted_voxels_per_class")
    if not counts:
        return "-"
    background, total = next(iter(counts.values())), sum(counts.values())
    if background == total:  # all background: no rounding can say so by mistake
        return "100%"
    return f"{min(100 * background / total, 99.99):.2f}%"


@newest("cross_entropy_weight")
def cross_entropy_weight(path: Path, doc: dict) -> str:
    """unet_tiny's cross-entropy weight 0.25 against 1.0 on few-class tasks
    (``cross_entropy_weight.py``)."""
    s = doc["settings"]
    head = (
        f"{rel(path)} ({results_io.machine_line(doc)}; {s['budget_s']} s a run, the two "
        f"weights at the same time, 1 thread each, {s['precision']}):"
    )
    return f"{head}\n\n{cross_entropy_rows(doc['rows'])}"


def cross_entropy_rows(rows: list[dict]) -> str:
    """The table of ``cross_entropy_weight.py`` rows: per dataset and weight, the mean over the
    seeds (what the script prints, and :func:`cross_entropy_weight` from its file)."""
    lines = [
        "| data | lambda_ce | runs | best val Dice (mean) | final val Dice (mean) "
        "| best, per run |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for data in dict.fromkeys(r["data"] for r in rows):
        for weight in sorted({r["lambda_ce"] for r in rows if r["data"] == data}):
            rs = [r for r in rows if (r["data"], r["lambda_ce"]) == (data, weight)]
            best = sum(r["dice_mean"] for r in rs) / len(rs)
            final = sum(r["final_dice_mean"] for r in rs) / len(rs)
            each = ", ".join(f"{r['dice_mean']:.3f}" for r in rs)
            lines.append(f"| {data} | {weight:g} | {len(rs)} | {best:.3f} | {final:.3f} | {each} |")
    return "\n".join(lines)


@newest("data_throughput")
def data_throughput(path: Path, doc: dict) -> str:
    """The training loader's samples/s per dataset and worker count, the CPU step beside it, and
    the workers a recorded GPU step needs (``data_throughput.py``)."""
    rows = doc["rows"]
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; batch 2, cached in memory):",
        "",
        "| what | data | setting | first batch (s) | training samples/s |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for r in rows:
        if r["what"] == "loader":
            data = f"{r['data']} {'x'.join(map(str, r['shape']))}, patch " + "x".join(
                map(str, r["patch"])
            )
            auto = f" ({r['resolved_workers']})" if r["num_workers"] == "auto" else ""
            lines.append(
                f"| loader | {data} | `data.num_workers={r['num_workers']}`{auto} | "
                f"{r['first_batch_s']:.2f} | {r['samples_per_s']:.1f} |"
            )
        elif r["what"] == "cpu_step":
            lines.append(
                f"| CPU training step | {r['shape']} | {r['model']}, {r['precision']} | | "
                f"{r['samples_per_s']:.2f} |"
            )
    feed = [r for r in rows if r["what"] == "gpu_feed"]
    if feed:
        lines += [
            "",
            "| recorded GPU step | samples/s needed | one worker delivers | workers needed |",
            "| --- | ---: | ---: | ---: |",
        ]
        for r in feed:
            lines.append(
                f"| {r['model']} {r['shape']}, {r['gpu']} ({r['recorded_in']}) | "
                f"{r['samples_per_s_needed']:.1f} | {r['one_worker_samples_per_s']:.1f} | "
                f"{r['workers_needed']} |"
            )
    return "\n".join(lines)


#: training_overheads.py's timer items, in the table's order
OVERHEADS = {
    "checkpoint writes during training": "saves during training (loop held)",
    "checkpoint writes at the end of fit (final save, waiting for writes)": "end of fit",
    "background writes (beside the loop)": "writer thread (beside the loop)",
    "logging": "logging",
    "validation overlays": "validation overlays",
    "memory monitor (per-step reads, charts written)": "memory monitor",
}


@newest("training_overheads")
def training_overheads(path: Path, doc: dict) -> str:
    """Wall time and what a run spends beside its steps, per ``async_checkpoint``
    (``training_overheads.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}):",
        "",
        "| run | `async_checkpoint` | steps | wall (s) | " + " | ".join(OVERHEADS.values()) + " |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in OVERHEADS) + " |",
    ]
    for r in doc["rows"]:
        cells = []
        for item in OVERHEADS:
            got = r["items"].get(item)
            if got is None:
                cells.append("–")
                continue
            share = got["seconds"] / r["wall_s"]
            cells.append(f"{got['seconds']:.2f} s, {got['calls']} calls, {share:.1%}")
        lines.append(
            f"| {r['run']}, {r['epochs']} epochs, max_time_share {r['max_time_share']} | "
            f"{r['async_checkpoint']} | {r['steps']} | {r['wall_s']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


@newest("levers")
def levers_cpu(path: Path, doc: dict) -> str:
    """Each memory lever's step rise, activations kept and step time on a CPU
    (``levers.py``)."""
    s = doc["settings"]
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; batch {s['batch']} of "
        f"1×{'×'.join(map(str, s['shape']))}, best of {s['steps']} steps):",
        "",
        "| lever | step adds (MiB) | ratio | activations kept (MiB) | ratio | s/step | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = doc["rows"][0]
    for r in doc["rows"]:
        lines.append(
            f"| {r['lever']} | {r['added_mib']:,.0f} | {r['added_mib'] / base['added_mib']:.2f} | "
            f"{r['activations_mib']:,.0f} | "
            f"{r['activations_mib'] / base['activations_mib']:.2f} | {r['seconds']:.2f} | "
            f"{r['seconds'] / base['seconds']:.2f} |"
        )
    return "\n".join(lines)


@newest("lever_time_factors")
def lever_time_factors(path: Path, doc: dict) -> str:
    """Each lever's predicted step-time factor (and its FLOPs factor) against the measured one
    (``lever_time_factors.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; float32, the fastest step of at least "
        f"{doc['steps']} and 3 s):",
        "",
        "| network | setting | predicted | FLOPs alone | measured | error |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        if not r["setting"]:
            continue  # the configured step: 1.00 by definition
        flops = r.get("flops_factor")
        lines.append(
            f"| {r['network']} | {r['setting'] or 'as configured'} | "
            f"{r['predicted_factor']:.2f} | {'' if flops is None else f'{flops:.2f}'} | "
            f"{r['measured_factor']:.2f} | {pct(r['error'])} |"
        )
    return "\n".join(lines)


@newest("train_throughput")
def train_throughput(path: Path, doc: dict) -> str:
    """Steps per second through Lightning and a plain loop, FLOPs and the fraction of the
    dtype's matmul peak (``train_throughput.py``)."""
    s = doc["settings"]
    peaks = s["matmul_peak_flops_per_s"]
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; batch {'×'.join(map(str, s['batch']))}, "
        f"best of {s['repeats']} after {s['warmup']} warm-up steps; matmul peak fp32 "
        f"{peaks['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f}):",
        "",
        "| network | variant | Lightning it/s | plain it/s | Lightning/plain | GFLOP/step "
        "| GFLOP/s | of dtype peak | plain |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        peak = peaks["bf16" if r["variant"].startswith("bf16") else "fp32"]
        lightning, plain = r["lightning_s_per_step"], r["plain_s_per_step"]
        lines.append(
            f"| {r['model']} | {r['variant']} | {1 / lightning:.2f} | {1 / plain:.2f} | "
            f"{plain / lightning:.2f} | {r['flops_per_step'] / 1e9:,.1f} | "
            f"{r['flops_per_step'] / lightning / 1e9:,.0f} | {r['of_dtype_peak']:.2f} | "
            f"{r['flops_per_step'] / plain / peak:.2f} |"
        )
    return "\n".join(lines)


@every_file(
    "default_run",
    "| file | CPU (cores) | ISA | precision `auto` chose | whole command | steps "
    "| best `val/dice_mean` | reached 0.80 at epoch |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
)
def default_run(path: Path, doc: dict) -> list[str]:
    """``python train.py`` timed whole, one row per results file (``default_run.py``)."""
    r = doc["rows"][0]
    minutes, seconds = divmod(round(r["whole_command_s"]), 60)
    return [
        f"| {rel(path)} | {doc['cpu']} ({doc.get('cores')}) | {held_isa(doc)} | "
        f"{r['precision']} | {minutes} min {seconds} s | {r['steps']} | "
        f"{r['best_val_dice_mean']:.3f} | {r['first_epoch_reaching']} |"
    ]


@every_file(
    "cpu_precision",
    "| file | CPU | ISA | work | float32 (s) | bf16 autocast (s) | bf16 / float32 |",
    "| --- | --- | --- | --- | ---: | ---: | ---: |",
)
def cpu_precision(path: Path, doc: dict) -> list[str]:
    """float32 against bf16 autocast per CPU and ISA setting (``cpu_precision.py``)."""
    return [
        f"| {rel(path)} | {doc['cpu']} | {held_isa(doc)} | {r['work']} | "
        f"{r['float32_s']:.3f} | {r['bf16_s']:.3f} | {r['ratio']:.2f} |"
        for r in doc["rows"]
    ]


@every_file(
    "memory_monitor_overhead",
    "| file | CPU | step without (ms) | with the monitor (ms) | difference | hooks (ms) "
    "| hooks, share of the step |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
)
def memory_monitor_overhead(path: Path, doc: dict) -> list[str]:
    """The memory monitor's hooks and a step with and without it, per results file
    (``memory_monitor_overhead.py``)."""
    lines = []
    for r in doc["rows"]:
        without, with_ = r["s_per_step_without"], r["s_per_step_with"]
        lines.append(
            f"| {rel(path)} | {doc['cpu']} | {without * 1e3:.1f} | {with_ * 1e3:.1f} | "
            f"{pct(with_ / without - 1)} | {r['hooks_s_per_step'] * 1e3:.2f} | "
            f"{r['hooks_share']:.2%} |"
        )
    return lines


@every_file(
    "cpu_bf16_conv",
    "| file | CPU | ISA | layer | input (N, C, D, H, W) | output | input gradient "
    "| weight gradient |",
    "| --- | --- | --- | --- | --- | ---: | ---: | ---: |",
)
def cpu_bf16_conv(path: Path, doc: dict) -> list[str]:
    """The largest relative error of bf16 convolutions against float32 per layer at the input
    depths of :data:`BF16_CONV_DEPTHS`, per CPU and ISA setting (``cpu_bf16_conv.py``); a wrong
    kernel's cell in bold."""
    lines = []
    for r in doc["rows"]:
        if r["input_shape"][2] not in BF16_CONV_DEPTHS:
            continue
        cells = [
            f"**{value:.2g}**" if wrong else f"{value:.4f}"
            for value, wrong in zip(
                (r["output"], r["input_gradient"], r["weight_gradient"]), r["wrong"], strict=True
            )
        ]
        lines.append(
            f"| {rel(path)} | {doc['cpu']} | {held_isa(doc)} | {r['layer']} | "
            f"{tuple(r['input_shape'])} | " + " | ".join(cells) + " |"
        )
    return lines


def nnunet_side_by_side(results: Path) -> str | None:
    """nnU-Net's 3d_fullres plan beside volseg's for the same 8 GB target, and volseg's estimate
    of nnU-Net's planned step on CUDA (``nnunet_side_by_side.py``,
    ``benchmarks/results/nnunet/side_by_side.json``)."""
    path = results / "nnunet" / "side_by_side.json"
    if not path.exists():
        return None
    from benchmarks.archive import nnunet_side_by_side as side_by_side

    doc = json.loads(path.read_text())
    m = doc["machine"]
    head = (
        f"{rel(path)} ({m['cpu']} ({', '.join(m['isa_flags'])}), torch {m['torch']}, nnU-Net v2 "
        f"{m['nnunetv2']}, {m['date']}: `{doc['command']}`; the step's memory is estimated by "
        f"volseg's estimator as of that date, not measured; the CUDA context is the estimator's "
        f"figure of that date, not a GPU's):"
    )
    return f"{head}\n\n{side_by_side.format_table(doc['rows'])}"
