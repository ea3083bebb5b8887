"""The file-drop connector: dropped files hashed into file keys and line-aligned splits."""

from idem_platform.connectors.filedrop.files import DroppedFile, Split, hash_file
from idem_platform.connectors.filedrop.plan import FileSlice, batch_of_files, file_unit
from idem_platform.connectors.filedrop.reader import read_split

__all__ = ["DroppedFile", "FileSlice", "Split", "batch_of_files", "file_unit", "hash_file", "read_split"]
