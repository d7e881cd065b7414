"""Runs side by side: records saved, loaded and gathered (`records`), rows of two runs aligned
(`alignment`), compared (`comparison`, its structural notes `structure`, `compare`) and drawn
(`compare_plot`). Works from frames and record files only."""
