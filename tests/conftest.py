"""Shared fixtures. Rich wraps at 80 columns under CliRunner: tests set a wide terminal first."""

from __future__ import annotations

import os

os.environ.setdefault("COLUMNS", "200")
os.environ.setdefault("TERMINAL_WIDTH", "200")
