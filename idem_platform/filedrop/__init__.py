"""The file-drop connector's core: hashing dropped files into keys and splits, reading splits."""

from idem_platform.filedrop.files import DroppedFile, Split, hash_file
from idem_platform.filedrop.reader import read_split

__all__ = ["DroppedFile", "Split", "hash_file", "read_split"]
