"""Training: the loop and what only training uses.

The one optimizer update (step: forward, loss, backward, clipping, Adam, the lr schedule;
eager or replayed as a CUDA graph), the train: settings (config), the loop around it (loop),
what a run trains with and where it stands (state), the epoch's running numbers (meter), the
run folder (folder) and what a finished run writes (outputs), every decision about its resume
state (resume) and the thread that writes it (state_writer), fault points (faults), several
processes (distributed, launch), CUDA graphs (graphs) and the precision an update and its
validation decoding run in (precision). Stage train is the command around loop.train; stage bench
times step's update; evaluate decodes in precision's choice.

May import: nmt.core, nmt.models, and other modules of nmt.training. Never nmt.pipeline,
nmt.stages, nmt.commands or nmt.cli (tests/test_layout.py holds the direction). Importing
this package imports no torch: `nmt train` with several devices only launches torchrun
(launch) and must stay light.
"""
