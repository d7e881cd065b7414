"""Runs side by side, from frames and record files only (nothing of a live recording): one
record file written and read back (`record_file`), a recorded run as a reader has it
(`recorded`: load, gather, findings, one rank's `Recorded`), rows of two runs aligned
(`alignment`), compared (`comparison`, its structural notes `structure`, `compare`), drawn
(`compare_plot`), and the ranks of a running job side by side (`side_by_side`).

The room's face: other rooms and wings import these names from here, never its files.
"""

from .comparison import Comparison, RankComparison, compare, compare_ranks
from .record_file import model_part, rank_path, save
from .recorded import Recorded, findings, from_folder, gather, load
from .side_by_side import SideBySide

__all__ = ["Comparison", "RankComparison", "Recorded", "SideBySide", "compare", "compare_ranks",
           "findings", "from_folder", "gather", "load", "model_part", "rank_path", "save"]
