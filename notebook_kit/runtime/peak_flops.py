"""Peak dense FLOPs per second of current GPUs, for model FLOPs utilisation (MFU).

The figures are the makers' published dense peaks (no sparsity), per precision: ``bf16``
(also used for fp16, which every part listed runs at the same rate), ``tf32`` (fp32 matrix
multiplies on tensor cores, what torch uses when ``allow_tf32`` is on) and ``fp32``. A GPU is
recognised by its name as ``torch.cuda.get_device_name`` reports it; a part not in the table,
and every CPU, has no peak, so no MFU is shown rather than a guessed one.
"""

from __future__ import annotations

__all__ = ["PEAK_FLOPS", "peak_flops"]

_T = 1e12

# name fragment (lower case, most specific first) -> (bf16, tf32, fp32) dense FLOP/s
PEAK_FLOPS: tuple[tuple[str, tuple[float, float, float]], ...] = (
    ("gb200", (2500 * _T, 1250 * _T, 80 * _T)),
    ("b200", (2250 * _T, 1100 * _T, 80 * _T)),
    ("h200", (989 * _T, 494 * _T, 67 * _T)),
    ("h100 pcie", (756 * _T, 378 * _T, 51 * _T)),
    ("h100", (989 * _T, 494 * _T, 67 * _T)),  # SXM and NVL
    ("gh200", (989 * _T, 494 * _T, 67 * _T)),
    ("a100", (312 * _T, 156 * _T, 19.5 * _T)),
    ("a800", (312 * _T, 156 * _T, 19.5 * _T)),
    ("l40s", (362 * _T, 183 * _T, 91.6 * _T)),
    ("l40", (181 * _T, 90.5 * _T, 90.5 * _T)),
    ("l4", (121 * _T, 60 * _T, 30.3 * _T)),
    ("a10g", (70 * _T, 35 * _T, 31.2 * _T)),
    ("a10", (125 * _T, 62.5 * _T, 31.2 * _T)),
    ("rtx 6000 ada", (364 * _T, 182 * _T, 91.1 * _T)),
    ("rtx a6000", (155 * _T, 77 * _T, 38.7 * _T)),
    ("4090", (165 * _T, 82.6 * _T, 82.6 * _T)),
    ("3090", (71 * _T, 35.6 * _T, 35.6 * _T)),
    ("v100", (125 * _T, 15.7 * _T, 15.7 * _T)),  # fp16 tensor cores; no bf16 or tf32
    ("t4", (65 * _T, 8.1 * _T, 8.1 * _T)),
    ("mi355x", (2500 * _T, 1250 * _T, 157 * _T)),
    ("mi325x", (1307 * _T, 653 * _T, 163 * _T)),
    ("mi300x", (1307 * _T, 653 * _T, 163 * _T)),
    ("mi250x", (383 * _T, 95.7 * _T, 95.7 * _T)),
    ("mi250", (362 * _T, 90.5 * _T, 90.5 * _T)),
)

_COLUMNS = {"bf16": 0, "fp16": 0, "fp8": 0, "tf32": 1, "fp32": 2}


def peak_flops(device_name: str, precision: str) -> float | None:
    """The dense peak of ``device_name`` at ``precision``; None for a part not in the table.

    ``precision`` is ``"bf16"``, ``"fp16"``, ``"tf32"`` or ``"fp32"``; fp8 runs are counted
    against the 16-bit peak, so their MFU is not flattered.

    Example:
        >>> peak_flops("NVIDIA H100 80GB HBM3", "bf16") / 1e12
        989.0
        >>> peak_flops("Intel Xeon", "bf16") is None
        True
    """
    name = device_name.lower()
    for fragment, peaks in PEAK_FLOPS:
        if fragment in name:
            return peaks[_COLUMNS[precision]]
    return None
