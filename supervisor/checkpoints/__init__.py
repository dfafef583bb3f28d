"""Checkpoint sync: LOCAL (where ranks write) mirrored to DEST (where checkpoints are kept).

``sync.CheckpointSync`` is what the daemon runs; ``store`` says what a destination
offers, ``local`` and ``remote`` are the two kinds; the decisions are pure, in
``supervisor.core.snapshots``; the options in ``supervisor.config.checkpoints``.
"""
