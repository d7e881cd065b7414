"""Colours that read in JupyterLab's light and dark themes, and HTML that MathJax leaves alone.

Text takes the theme's own colours (JupyterLab's CSS variables, with light-theme fallbacks for
VS Code, Notebook 6 and nbconvert pages, which lack them). Backgrounds are translucent tints, so
the theme's text colour stays readable on them: light text on a pale green row is what a fixed
`#eaf6ea` gave in the dark theme. Accent colours are mid-tones that read on white and on black.

JupyterLab typesets text/html outputs with MathJax: "$CUDA_VISIBLE_DEVICES ... $" became
LaTeX. `no_math` writes every `$` as `&#36;` and marks the output's root with the classes
MathJax skips, so no dollar sign in a path, a message or an environment variable is math.
"""

from __future__ import annotations

TEXT = "var(--jp-ui-font-color1, #222)"
MUTED = "var(--jp-ui-font-color2, #666)"  # secondary lines: readable grey in both themes
GOOD = "var(--jp-success-color1, #2e7d32)"
WARN = "var(--jp-warn-color1, #b35900)"
ERROR = "var(--jp-error-color1, #c62828)"
INFO = "var(--jp-brand-color1, #1565c0)"
# translucent row tints: the theme's text colour shows through on both backgrounds
GOOD_ROW = "rgba(46, 160, 67, 0.18)"
BAD_ROW = "rgba(214, 39, 40, 0.18)"
TRACK = "rgba(128, 128, 128, 0.25)"  # the empty part of a bar

# MathJax 2 (Notebook 6, nbconvert) skips `tex2jax_ignore`, MathJax 3 (JupyterLab 4)
# `mathjax_ignore`: put on the root element of every HTML output.
NO_MATH_CLASSES = "tex2jax_ignore mathjax_ignore"


def no_math(markup: str) -> str:
    """`markup` with every `$` written `&#36;` (safe: `$` has no meaning in HTML syntax)."""
    return markup.replace("$", "&#36;")
