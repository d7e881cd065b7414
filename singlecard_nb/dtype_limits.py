"""What overflow means for each floating dtype, by the name rows carry (ground floor: plain
Python, imports nothing, so the ranking's rules stay free of torch).

LARGEST_HALF: the largest finite value of float16, as the words say it: the one dtype whose
overflow computing in float32 avoids (bfloat16's range is float32's: what overflows it has
exploded, and float32 would not hold it either).
EXPLODED: an activation at least this large has exploded: its products and squares reach the
dtype's largest value (largest ** 0.4; float32: 2e15, where a healthy network's stay below 1e4).
"""

from __future__ import annotations

LARGEST_HALF = {"float16": "65504"}
_LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
            "float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}
EXPLODED = {name: largest ** 0.4 for name, largest in _LARGEST.items()}
