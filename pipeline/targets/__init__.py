"""Targets that follow the pixels: boxes and masks through the crop, resize and flips of a batch,
eval framing mapped back to the source image, and a batch's targets in the shapes detection
and segmentation models take. Plain numpy arrays in (the store's ``object_offsets``,
``objects``, ``frames`` and ``masks``), numpy or torch out; no DALI here."""
