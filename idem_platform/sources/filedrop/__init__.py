"""The file-drop connector: dropped files hashed into file keys and line-aligned splits."""

from idem_platform.sources.filedrop.files import DroppedFile, Split, hash_file
from idem_platform.sources.filedrop.plan import FileSlice, batch_of_files, file_unit
from idem_platform.sources.filedrop.reader import read_split

__all__ = ["DroppedFile", "FileSlice", "Split", "batch_of_files", "file_unit", "hash_file", "read_split"]
