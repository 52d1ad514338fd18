"""Object store (fsspec) and the layout module that owns every key."""

from tuneforge.storage.store import FsspecStore, ObjectStore, open_store

__all__ = ["FsspecStore", "ObjectStore", "open_store"]
