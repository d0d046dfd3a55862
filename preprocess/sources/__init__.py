"""Finding the source images and their labels: class folders, a bucket, a manifest; streamed
to a list on disk, sorted by runs on disk where needed."""
