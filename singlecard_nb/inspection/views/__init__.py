"""What people read, from recorded rows (never from the recording machinery): the ranking of
what changed (`ranking`), numbers and shapes as text (`formatting`), the summary (`summary`),
the live view (`live`, its page `live_html`), a rank's latest steps for the notebook
(`latest`), and the figures (`heatmap`, its rows `heatmap_rows`, `histograms`, drawn with
`figures`, the one figure helper). `figures`, `heatmap` and `histograms` are exported as
modules: a name a face exports never hides one of its files.

The room's face: other rooms and wings import these names from here, never its files.
"""

from . import figures, heatmap, histograms
from .formatting import escape, num
from .latest import Latest
from .live import live_view, updates_in_place
from .ranking import findings
from .summary import Summary, html_table

__all__ = ["Latest", "Summary", "escape", "figures", "findings", "heatmap", "histograms",
           "html_table", "live_view", "num", "updates_in_place"]
