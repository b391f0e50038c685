"""FastLoader: a multiprocess shared-memory loader built on wdsmp's stages."""
