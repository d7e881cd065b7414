"""What people read: the ranking of what changed (`ranking`), numbers and shapes as text
(`formatting`), the summary, the live view (`live`, its page `live_html`), and the figures
(`heatmap`, its rows `heatmap_rows`, `histograms`, drawn with `figures`). Works from recorded rows, never from the recording machinery."""
