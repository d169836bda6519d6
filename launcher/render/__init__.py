"""Pure renderers: resolved config (+ plan) -> the text of launch artifacts. No side effects."""
