"""Writes docs/CONFIGURATION.md from the settings model."""

from pathlib import Path

from dankserve.config_reference import render_reference

if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "docs" / "CONFIGURATION.md"
    target.write_text(render_reference())
    print(f"wrote {target}")
