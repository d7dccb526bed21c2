"""What the local Kafka broker runs on: a JDK 17+ and its jars, fetched once from Maven Central.

    KafkaRuntime.resolve()  -> java=/usr/bin/java, libs=~/.cache/tokenmill/kafka/4.1.1/libs
    runtime.command("kafka.Kafka", "server.properties", log4j2=...)  -> a java command line

Maven resolves `kafka_2.13` and a log4j2 binding into a temporary folder beside the cache entry,
which is then renamed into place with a marker inside it; a file lock keeps two processes from
resolving at once. A cache entry with its marker is reused without running Maven at all.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ops.errors import JavaNotFound, MavenError
from ops.models.registry import cache_dir

KAFKA_VERSION = "4.1.1"
# Kafka 4.1 logs through slf4j-api 1.7.x, so the binding is log4j2's slf4j-1 one.
LOG4J_VERSION = "2.24.3"
MARKER = ".complete"
MIN_JAVA = 17
_MVN_TIMEOUT_S = 600.0
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


@dataclass(frozen=True)
class KafkaRuntime:
    """A JDK and the broker's jars: everything `java ... kafka.Kafka` needs."""

    java: Path
    libs: Path

    @classmethod
    def resolve(cls) -> KafkaRuntime:
        """Find Java 17+ and resolve the jars (Maven Central on first use only)."""
        return cls(java=find_java(), libs=resolve_kafka_jars(KAFKA_VERSION))

    def command(self, main: str, *args: str, log4j2: Path, jvm: tuple[str, ...] = ()) -> list[str]:
        return [
            str(self.java),
            *jvm,
            f"-Dlog4j2.configurationFile={log4j2}",
            "-cp",
            f"{self.libs}/*",
            main,
            *args,
        ]


def find_java() -> Path:
    """`$JAVA_HOME/bin/java`, else `java` on PATH; `JavaNotFound` if absent or older than 17."""
    if home := os.environ.get("JAVA_HOME"):
        java = Path(home) / "bin" / "java"
        if not java.is_file():
            raise JavaNotFound(
                f"JAVA_HOME={home} has no bin/java; point it at a JDK {MIN_JAVA}+ or unset it"
            )
    elif found := shutil.which("java"):
        java = Path(found)
    else:
        raise JavaNotFound(
            f"no `java` on PATH and JAVA_HOME is unset; install a JDK {MIN_JAVA}+ "
            "(e.g. `apt-get install openjdk-17-jre-headless`)"
        )
    try:
        done = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFound(f"`{java} -version` failed: {exc}") from exc
    major = parse_java_major(done.stderr + done.stdout)
    if major < MIN_JAVA:
        raise JavaNotFound(
            f"{java} is Java {major}; Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+ "
            "(set JAVA_HOME to a newer JDK)"
        )
    return java


def parse_java_major(version_output: str) -> int:
    """The major version in `java -version` output: "17.0.15" → 17, "1.8.0_292" → 8."""
    match = _VERSION.search(version_output)
    if match is None:
        raise JavaNotFound(f"cannot read a Java version from {version_output.strip()[:200]!r}")
    major = int(match[1])
    return int(match[2]) if major == 1 and match[2] is not None else major


def render_pom(kafka_version: str = KAFKA_VERSION, log4j_version: str = LOG4J_VERSION) -> str:
    """A throwaway project whose runtime dependencies are exactly the broker's classpath."""
    deps = [
        ("org.apache.kafka", "kafka_2.13", kafka_version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", log4j_version),
        ("org.apache.logging.log4j", "log4j-core", log4j_version),
    ]
    lines = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tokenmill.local</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{kafka_version}</version>
  <dependencies>
{lines}
  </dependencies>
</project>
"""


def kafka_libs_dir(kafka_version: str = KAFKA_VERSION) -> Path:
    """Where the broker's jars live once resolved (it may not exist yet)."""
    return cache_dir() / "kafka" / kafka_version / "libs"


def is_resolved(kafka_version: str = KAFKA_VERSION) -> bool:
    return (kafka_libs_dir(kafka_version) / MARKER).is_file()


def resolve_kafka_jars(kafka_version: str = KAFKA_VERSION) -> Path:
    """Make the broker's jars present in the cache and return their folder.

    The first call runs `mvn dependency:copy-dependencies` (Maven Central, about 43 MB); later
    calls only check the marker. Raises `MavenError` when Maven is missing or fails.
    """
    libs = kafka_libs_dir(kafka_version)
    if is_resolved(kafka_version):
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(libs.parent / ".lock"):
        if is_resolved(kafka_version):  # another process finished while we waited
            return libs
        with tempfile.TemporaryDirectory(dir=libs.parent, prefix=".resolve-") as tmp:
            staged = Path(tmp) / "libs"
            _copy_dependencies(Path(tmp), staged, kafka_version)
            jars = sorted(p.name for p in staged.glob("*.jar"))
            if f"kafka_2.13-{kafka_version}.jar" not in jars:
                raise MavenError(
                    f"Maven finished but {staged} has no kafka_2.13-{kafka_version}.jar"
                )
            (staged / MARKER).write_text("\n".join(jars) + "\n")
            if libs.exists():  # left by an older, interrupted layout; it has no marker
                shutil.rmtree(libs)
            # Same filesystem (tmp is beside the target), so the folder appears whole or not at all.
            os.rename(staged, libs)
    return libs


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if absent), held for the block."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copy_dependencies(project: Path, out: Path, kafka_version: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            "Maven (`mvn`) is not on PATH; it is needed once to fetch the Kafka broker's jars "
            "from Maven Central (install it, e.g. `apt-get install maven`)"
        )
    (project / "pom.xml").write_text(render_pom(kafka_version))
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(project / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={out}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise MavenError(f"Maven did not finish within {_MVN_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise MavenError(
            f"Maven could not resolve org.apache.kafka:kafka_2.13:{kafka_version} "
            f"(exit {done.returncode}); check that Maven Central is reachable (proxy settings "
            f"in ~/.m2/settings.xml):\n{tail}"
        )
