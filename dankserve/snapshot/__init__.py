"""Snapshots of a warm server (issue 41): what makes one valid, which ones the disk budget evicts.

Pure: no file, process or clock is touched here; the store and the CRIU edge come later
(docs/snapshots.md says what is built and what remains).
"""
