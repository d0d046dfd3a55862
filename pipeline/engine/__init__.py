"""The engine: reader threads fill batches, a DALI graph decodes and augments them on the
device, and idle graphs wait in a pool for the next Loader."""
