"""The bottom layer: error types, the registry, multi-process helpers, meshes and sharding.

Nothing here imports any other part of the package.
"""
