"""Training recipes: what is done to each sample beside the crop, as settings, draws and graph ops."""
