"""Level 1: a copy of the source files on the local file system, made on first read.

``local_dir/<hash of the source root>/<relative path>``. A copy is valid when its size and
modification time equal the source file's (as scanned when the source was built); otherwise the file
is read from the source again and replaced atomically (written to a unique temporary name in the same
directory, then renamed), so a reader never sees a partial copy, even with several ranks copying.
"""
import hashlib
import os
import logging
import tempfile

log = logging.getLogger("datacache")


class LocalCopy:
    def __init__(self, local_dir):
        self.dir = os.path.abspath(os.fspath(local_dir))
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
        except OSError as e:
            raise ValueError(f"local_dir {self.dir!r} cannot be created: {e}") from None
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise ValueError(f"local_dir {self.dir!r} is not writable")
        self.write_error = None

    def _path(self, source, i):
        root = hashlib.sha256(source.root.encode()).hexdigest()[:16]
        return os.path.join(self.dir, root, source.files[i])

    def read(self, source, i):
        """Returns (bytes, bytes read from the source): 0 when the local copy was valid."""
        local = self._path(source, i)
        try:
            st = os.stat(local)
            if st.st_size == source.sizes[i] and st.st_mtime_ns == source.mtimes[i]:
                with open(local, "rb") as f:
                    return f.read(), 0
        except FileNotFoundError:
            pass
        with open(source.path(i), "rb") as f:
            data = f.read()
        try:
            self._write(local, data, int(source.mtimes[i]))
        except OSError as e:   # a full or read-only local disk costs speed, never a sample
            if not self.write_error:
                log.warning("datacache: cannot write the local copy %s (%s); reading from the source", local, e)
            self.write_error = str(e)
        return data, len(data)

    @staticmethod
    def _write(path, data, mtime_ns):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def read_source(source, i):
    """No level 1: the bytes of sample i straight from the source, and how many were read."""
    with open(source.path(i), "rb") as f:
        data = f.read()
    return data, len(data)
