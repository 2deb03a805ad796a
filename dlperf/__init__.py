"""dlperf: predict deep-learning training performance from work-depth and alpha-beta models."""

from __future__ import annotations

__version__ = "0.1.0"
