"""Markdown helpers the report's sections share: a table from a DataFrame, a model output."""

from __future__ import annotations

import pandas as pd


def md_table(df: pd.DataFrame, floatfmt=".2f", text: bool = False) -> str:
    """A markdown table; text=True keeps cells as written (no re-formatting of numbers)."""
    return df.to_markdown(index=False, floatfmt=floatfmt, disable_numparse=text)


def shown(text: str) -> str:
    """A model output as markdown: an empty one reads *(empty)*, not as bare emphasis marks."""
    return text if text.strip() else "*(empty)*"
