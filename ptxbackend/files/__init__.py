"""File-system rules every other package relies on (a leaf package: imports only ``ptxbackend.errors``).

Owns: :mod:`.private` (files written whole and private, never through a planted link, read back
only when they are ours; locks; maintenance beneath a directory descriptor), :mod:`.user` (files a
user names: regular files only, bounded reads, outputs renamed into place), :mod:`.inotify` (the
Linux inotify binding) and :mod:`.watching` (this process's one watcher of files earlier checks
trust).
"""
