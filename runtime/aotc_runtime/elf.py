"""A small, bounds-checked ELF reader: section headers, section names and defined dynamic symbols.

It reads the kernel library's bytes before anything loads them, so a package's native code never runs
before the package is checked. ELF32 and ELF64, little- and big-endian; anything malformed is an
`ElfError`, never an IndexError or struct.error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["MACHINES", "ElfError", "ElfImage", "ElfSection", "read_elf"]

# e_machine values and the architecture names target triples use for them
MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}

_SHT_NOBITS = 8
_SHT_DYNSYM = 11
_SHF_EXECINSTR = 0x4
_SHN_UNDEF = 0
_SHN_LORESERVE = 0xFF00
_SHN_XINDEX = 0xFFFF
_STT_FUNC = 2
_STB_GLOBAL, _STB_WEAK = 1, 2
_STV_DEFAULT = 0


class ElfError(ValueError):
    """The bytes are not a well-formed ELF file; the message says what is wrong."""


@dataclass(frozen=True)
class ElfSection:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class ElfImage:
    """What the checks need of an ELF file: its class, machine, sections and defined dynamic functions."""

    bits: int
    machine: int
    sections: tuple[ElfSection, ...]
    data: bytes

    @property
    def arch(self) -> str:
        """The machine as a triple's architecture (x86_64, aarch64, arm), or `machine <n>`."""
        return MACHINES.get(self.machine, f"machine {self.machine}")

    def section(self, name: str) -> bytes | None:
        """The bytes of the one section called `name`; None when there is none."""
        found = [s for s in self.sections if s.name == name]
        if not found:
            return None
        if len(found) > 1:
            raise ElfError(f"it has {len(found)} sections named {name}")
        return self._bytes(found[0])

    def defined_functions(self) -> frozenset[str]:
        """Names of the functions the file itself defines and exports (global or weak, default
        visibility, in an executable section) according to its dynamic symbol table."""
        names: set[str] = set()
        for sec in self.sections:
            if sec.type == _SHT_DYNSYM:
                names |= self._dynsym_functions(sec)
        return frozenset(names)

    def _bytes(self, sec: ElfSection) -> bytes:
        if sec.type == _SHT_NOBITS:
            return b""
        if sec.offset + sec.size > len(self.data):
            raise ElfError(f"section {sec.name or '#?'} lies beyond the end of the file")
        return self.data[sec.offset : sec.offset + sec.size]

    def _dynsym_functions(self, sec: ElfSection) -> set[str]:
        entsize = 24 if self.bits == 64 else 16
        if sec.entsize != entsize or sec.size % entsize:
            raise ElfError(f"its dynamic symbol table has entries of {sec.entsize} bytes, expected {entsize}")
        if not 0 < sec.link < len(self.sections):
            raise ElfError("its dynamic symbol table names no string table")
        table, strings = self._bytes(sec), self._bytes(self.sections[sec.link])
        endian = "<" if self._little else ">"
        layout = endian + ("IBBHQQ" if self.bits == 64 else "IIIBBH")
        names = set()
        for pos in range(0, len(table), entsize):
            fields = struct.unpack_from(layout, table, pos)
            if self.bits == 64:
                name, info, other, shndx = fields[0], fields[1], fields[2], fields[3]
            else:
                name, info, other, shndx = fields[0], fields[3], fields[4], fields[5]
            if shndx == _SHN_UNDEF or shndx >= _SHN_LORESERVE or shndx >= len(self.sections):
                continue
            if info & 0xF != _STT_FUNC or info >> 4 not in (_STB_GLOBAL, _STB_WEAK):
                continue
            if other & 0x3 != _STV_DEFAULT or not self.sections[shndx].flags & _SHF_EXECINSTR:
                continue
            names.add(_cstring(strings, name, "dynamic symbol name"))
        return names

    @property
    def _little(self) -> bool:
        return self.data[5] == 1


MAX_NAME = 4096  # aotc's names are short C identifiers; a longer one is damage (as the C runtime reads it)


def _cstring(table: bytes, offset: int, what: str) -> str:
    if offset >= len(table):
        raise ElfError(f"a {what} points outside its string table")
    # bounded: thousands of names at one offset of a huge table without a NUL would take minutes
    end = table.find(b"\0", offset, offset + MAX_NAME + 1)
    if end < 0:
        raise ElfError(f"a {what} is not NUL-terminated within {MAX_NAME} bytes")
    try:
        return table[offset:end].decode("ascii")
    except UnicodeDecodeError:
        raise ElfError(f"a {what} is not ASCII") from None


def read_elf(data: bytes) -> ElfImage:
    """Parse the ELF header and section headers of `data`; raise ElfError when any is malformed."""
    data = bytes(data)
    if len(data) < 16 or data[:4] != b"\x7fELF":
        raise ElfError("it is not an ELF file (bad magic)")
    bits = {1: 32, 2: 64}.get(data[4])
    if bits is None:
        raise ElfError(f"unknown ELF class {data[4]}")
    endian = {1: "<", 2: ">"}.get(data[5])
    if endian is None:
        raise ElfError(f"unknown ELF data encoding {data[5]}")
    header = endian + ("HHIQQQIHHHHHH" if bits == 64 else "HHIIIIIHHHHHH")
    if len(data) < 16 + struct.calcsize(header):
        raise ElfError("its ELF header is truncated")
    _, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx = struct.unpack_from(header, data, 16)
    raw = _section_headers(data, bits, endian, shoff, shentsize, shnum, shstrndx)
    if not raw:
        raise ElfError("it has no section headers")
    strndx = raw[0][6] if shstrndx == _SHN_XINDEX else shstrndx
    if not 0 < strndx < len(raw):
        raise ElfError(f"its section name table index {strndx} is out of range")
    names_sec = raw[strndx]
    if names_sec[1] == _SHT_NOBITS or names_sec[4] + names_sec[5] > len(data):
        raise ElfError("its section name table lies beyond the end of the file")
    names = data[names_sec[4] : names_sec[4] + names_sec[5]]
    sections = []
    for i, (name, type_, flags, _, offset, size, link, entsize) in enumerate(raw):
        if i and type_ != _SHT_NOBITS and offset + size > len(data):
            raise ElfError(f"section {i} lies beyond the end of the file")
        label = _cstring(names, name, "section name") if i else ""
        sections.append(ElfSection(label, type_, flags, offset, size, link, entsize))
    return ElfImage(bits, machine, tuple(sections), data)


def _section_headers(
    data: bytes, bits: int, endian: str, shoff: int, shentsize: int, shnum: int, shstrndx: int
) -> list[tuple[int, ...]]:
    """(name, type, flags, addr, offset, size, link, entsize) of every section header."""
    layout = endian + ("IIQQQQIIQQ" if bits == 64 else "IIIIIIIIII")
    if shoff == 0:
        return []
    if shentsize != struct.calcsize(layout):
        raise ElfError(f"its section headers are {shentsize} bytes, expected {struct.calcsize(layout)}")

    def header(i: int) -> tuple[int, ...]:
        pos = shoff + i * shentsize
        if pos + shentsize > len(data):
            raise ElfError(f"section header {i} lies beyond the end of the file")
        name, type_, flags, addr, offset, size, link, _info, _align, entsize = struct.unpack_from(
            layout, data, pos
        )
        return (name, type_, flags, addr, offset, size, link, entsize)

    first = header(0)
    count = shnum or first[5]  # more than SHN_LORESERVE sections: the count lives in section 0's size
    if count * shentsize > len(data):
        raise ElfError(f"its {count} section headers do not fit in the file")
    return [first] + [header(i) for i in range(1, count)]
