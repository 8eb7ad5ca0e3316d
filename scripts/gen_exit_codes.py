"""Writes README.md's exit-code table from dankserve/exitcodes.py."""

from pathlib import Path

from dankserve.exitcodes import with_table

if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "README.md"
    target.write_text(with_table(target.read_text()))
    print(f"wrote the exit-code table of {target}")
