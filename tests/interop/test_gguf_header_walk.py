"""The GGUF header walk (interop/gguf_read.py: ``_walk_header`` and its ``_Cursor``) at every bound it sets,
on headers built here byte by byte from the GGUF spec (ggml's docs/gguf.md: magic, version, tensor and key
counts, typed key/values, tensor infos, alignment), not with gptforge's or the gguf package's writer.

Each bound is tried on both sides: the largest value allowed gets past it (the walk goes on to the next check,
or ends), one more is refused in one line naming the file and what is wrong. A file the walk accepts is read
again by the ``gguf`` package's own reader (an independent parser), which must agree on every value, tensor
offset and where the data starts. These are tests of mutation lane ``gguf`` (pyproject.toml)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from gptforge.interop.gguf_read import (  # noqa: E402
    MAX_ARRAY,
    MAX_DIMS,
    MAX_ELEMENTS,
    MAX_ITEM_STRING,
    MAX_KEY,
    MAX_KV,
    MAX_STRING,
    MAX_TENSORS,
    GGUFReadError,
    _walk_header,
)

PATH = Path("/models/x.gguf")
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
F32_T, Q8_0_T, IQ2_XXS_T = 0, 8, 16  # ggml tensor types: F32, Q8_0 (blocks of 32 values in 34 bytes), unsupported


def s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tensor(name: str, dims: list[int], ttype: int, offset: int) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype,
                                                                                                       offset)


def header(kvs: list[bytes] = (), tensors: list[bytes] = (), version: int = 3, n_tensors: int | None = None,
           n_kv: int | None = None) -> bytes:
    return (b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                  len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tensors))


def padded(head: bytes, alignment: int, data: int) -> bytes:
    """``head``, zeros up to the next multiple of ``alignment``, then ``data`` bytes of tensor data."""
    return head + b"\0" * (-len(head) % alignment) + b"\1" * data


def refusal(buf: bytes) -> str | None:
    try:
        _walk_header(PATH, buf)
    except GGUFReadError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(f"{PATH}: ")
        return msg
    return None


# --- a file the walk accepts, read again by the gguf package -------------------------------------------

SCALARS = [("u8", U8, "<B", 200), ("i8", I8, "<b", -100), ("u16", U16, "<H", 60000), ("i16", I16, "<h", -30000),
           ("u32", U32, "<I", 4_000_000_000), ("i32", I32, "<i", -2_000_000_000), ("f32", F32, "<f", 1.5),
           ("bool", BOOL, "<?", True), ("u64", U64, "<Q", 2**63 + 5), ("i64", I64, "<q", -2**62),
           ("f64", F64, "<d", -0.25)]


@pytest.mark.parametrize("alignment", [None, 1, 64])
def test_every_value_type_and_tensor_info_as_the_spec_lays_them_out(tmp_path, alignment):
    kvs = [kv(f"k.{n}", t, struct.pack(f, v)) for n, t, f, v in SCALARS]
    kvs += [kv("k.str", STRING, s("héllo")),
            kv("k.arr_u32", ARRAY, struct.pack("<IQ", U32, 3) + struct.pack("<3I", 1, 2, 70000)),
            kv("k.arr_str", ARRAY, struct.pack("<IQ", STRING, 3) + s("a") + s("bc") + s(""))]
    if alignment is not None:
        kvs.append(kv("general.alignment", U32, struct.pack("<I", alignment)))
    align = alignment or 32
    q_offset = -(-3 * 2 * 4 // align) * align  # the F32 tensor's 24 bytes, rounded up
    tensors = [tensor("a.weight", [3, 2], F32_T, 0), tensor("b.weight", [64, 2, 1], Q8_0_T, q_offset)]
    head = header(kvs, tensors)
    n_data = q_offset + 2 * 2 * 34  # two rows of two Q8_0 blocks
    buf = padded(head, align, n_data)
    h = _walk_header(PATH, buf)

    assert h.data_start == -(-len(head) // align) * align
    assert [h.scalars[f"k.{n}"] for n, *_ in SCALARS] == [v for *_, v in SCALARS]
    assert h.scalars["k.str"] == "héllo"
    assert h.arrays["k.arr_u32"] == (U32, 3) and h.items["k.arr_u32"] == [1, 2, 70000]
    assert h.arrays["k.arr_str"] == (STRING, 3) and h.items["k.arr_str"] == [b"a", b"bc", b""]
    assert "k.arr_u32" not in h.scalars and "k.str" not in h.arrays
    assert [(t.name, t.shape, t.type_name, t.offset, t.n_bytes) for t in h.infos] == [
        ("a.weight", (2, 3), "F32", 0, 24), ("b.weight", (1, 2, 64), "Q8_0", q_offset, 136)]

    path = tmp_path / "x.gguf"
    path.write_bytes(buf)
    r = gguf.GGUFReader(str(path))
    assert r.data_offset == h.data_start
    for t, ours in zip(r.tensors, h.infos, strict=True):
        assert (t.name, t.tensor_type.name, t.data_offset - r.data_offset, int(t.n_bytes)) == (
            ours.name, ours.type_name, ours.offset, ours.n_bytes)
        assert tuple(int(d) for d in reversed(t.shape)) == ours.shape
    for n, *_, v in SCALARS:
        assert r.fields[f"k.{n}"].contents() == pytest.approx(v)
    assert r.fields["k.arr_str"].contents() == ["a", "bc", ""]


@pytest.mark.parametrize("version, ok", [(1, False), (2, True), (3, True), (4, False)])
def test_versions_two_and_three(version, ok):
    msg = refusal(header(version=version) + b"\0" * 8)
    assert msg is None if ok else f"GGUF.version={version} (gptforge reads versions 2 and 3)" in msg


def test_the_magic_and_the_refusals_wording():
    assert refusal(b"GGUG" + b"\0" * 40) == f"{PATH}: no GGUF magic at the start; not a GGUF file gptforge can read"
    assert refusal(b"GGUF\3\0") == (f"{PATH}: truncated at byte 4 reading the version (4 bytes, file has 6); not a "
                                    "GGUF file gptforge can read")


# --- the counts ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, size, absurd", [(4, 96, False), (4, 95, True), (MAX_TENSORS, 24 * MAX_TENSORS, False),
                                             (MAX_TENSORS + 1, 24 * (MAX_TENSORS + 1), True)])
def test_the_tensor_count_against_the_file_size_and_its_cap(n, size, absurd):
    """Each tensor info takes at least 24 bytes; past the count check the zeros read as a tensor named ''
    with 0 dimensions, refused by the next check."""
    buf = header(n_tensors=n).ljust(size, b"\0")
    msg = refusal(buf)
    if absurd:
        assert f"GGUF.tensor_count={n} is absurd for a {size}-byte file (at most {MAX_TENSORS})" in msg
    else:
        assert "tensor  has 0 dimensions (1 to 4)" in msg


@pytest.mark.parametrize("n, size, outcome", [(3, 39, "truncated"), (3, 38, "absurd"),
                                              (MAX_KV, 24 + 13 * MAX_KV, None),
                                              (MAX_KV + 1, 24 + 13 * (MAX_KV + 1), "absurd")])
def test_the_key_count_against_the_file_size_and_its_cap(n, size, outcome):
    """A key/value takes at least 13 bytes (an empty key, its type, a u8): zeros are exactly that."""
    msg = refusal(header(n_kv=n).ljust(size, b"\0"))
    if outcome is None:
        assert msg is None
    elif outcome == "absurd":
        assert f"GGUF.kv_count={n} is absurd for a {size}-byte file (at most {MAX_KV})" in msg
    else:
        assert "truncated" in msg


# --- strings and arrays --------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_key_and_string_lengths_at_their_caps(extra, ok):
    long_key = "k" * (MAX_KEY + extra)
    msg = refusal(header([kv(long_key, U8, b"\7")]) + b"\0" * 8)
    assert msg is None if ok else f"a metadata key is {MAX_KEY + 1} bytes long (at most {MAX_KEY})" in msg
    msg = refusal(header([kv("general.name", STRING, s("n" * (MAX_STRING + extra)))]) + b"\0" * 8)
    assert msg is None if ok else f"general.name is {MAX_STRING + 1} bytes long (at most {MAX_STRING})" in msg
    item = "t" * (MAX_ITEM_STRING + extra)
    msg = refusal(header([kv("tok.tokens", ARRAY, struct.pack("<IQ", STRING, 2) + s("a") + s(item))]) + b"\0" * 8)
    assert msg is None if ok else (f"an item of tok.tokens is {MAX_ITEM_STRING + 1} bytes long "
                                   f"(at most {MAX_ITEM_STRING})") in msg


def test_a_string_that_is_not_utf8():
    assert refusal(header([kv(b"k\xff", U8, b"\0")]) + b"\0" * 8) == (
        f"{PATH}: a metadata key is not UTF-8; not a GGUF file gptforge can read")
    assert "general.name is not UTF-8" in refusal(header([kv("general.name", STRING, s(b"\xc3("))]) + b"\0" * 8)


@pytest.mark.parametrize("itype, size", [(U8, 1), (U32, 4), (F64, 8), (STRING, 8)])
def test_an_array_must_fit_in_what_is_left_of_the_file(itype, size):
    """The count times the item size (8, a length, for each string) against the bytes after the count."""
    n = 5
    head = header([kv("a", ARRAY, struct.pack("<IQ", itype, n))])
    fits = head + (b"\0" * n * size)  # zeros: numbers 0, or strings of length 0
    h = _walk_header(PATH, fits)
    assert h.arrays["a"] == (itype, n) and h.items["a"] == ([b""] * n if itype == STRING else [0] * n)
    assert "a claims 5 items (at most" in refusal(fits[:-1])


def test_an_array_at_its_cap():
    head = header([kv("a", ARRAY, struct.pack("<IQ", U8, MAX_ARRAY))])
    h = _walk_header(PATH, head + b"\2" * MAX_ARRAY)
    assert h.arrays["a"] == (U8, MAX_ARRAY) and len(h.items["a"]) == MAX_ARRAY and h.items["a"][-1] == 2
    head = header([kv("a", ARRAY, struct.pack("<IQ", U8, MAX_ARRAY + 1))])
    assert f"a claims {MAX_ARRAY + 1} items (at most {MAX_ARRAY}" in refusal(head + b"\2" * (MAX_ARRAY + 1))


@pytest.mark.parametrize("entry, match", [
    (kv("n", ARRAY, struct.pack("<IQ", ARRAY, 1)), "n is an array of type 9 (nested arrays are not read)"),
    (kv("n", ARRAY, struct.pack("<IQ", 13, 1)), "n is an array of type 13"),
    (kv("n", 13, b"\0" * 8), "metadata key n has unknown type 13")])
def test_value_types_outside_the_spec(entry, match):
    assert match in refusal(header([entry]) + b"\0" * 16)


# --- alignment -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, ok", [((U32, "<I", 1), True), ((U32, "<I", 2), True), ((U32, "<I", 65536), True),
                                       ((U32, "<I", 0), False), ((U32, "<I", 3), False), ((U32, "<I", 48), False),
                                       ((U32, "<I", 131072), False), ((F32, "<f", 32.0), False),
                                       ((I32, "<i", -32), False)])
def test_the_alignment_is_a_power_of_two_up_to_65536(value, ok):
    vtype, fmt, v = value
    head = header([kv("general.alignment", vtype, struct.pack(fmt, v))], [tensor("t", [1], F32_T, 0)])
    buf = padded(head, v if ok else 1, 4)
    msg = refusal(buf)
    if ok:
        assert msg is None and _walk_header(PATH, buf).data_start == -(-len(head) // v) * v
    else:
        assert f"general.alignment={v!r} must be a power of two up to 65536" in msg


def test_a_string_alignment_is_refused():
    assert "general.alignment='32' must be a power of two" in refusal(
        header([kv("general.alignment", STRING, s("32"))]) + b"\0" * 8)


# --- tensor infos --------------------------------------------------------------------------------------

def _one(dims: list[int], ttype: int = F32_T, offset: int = 0, data: int | None = None, name: str = "t") -> str | None:
    head = header([], [tensor(name, dims, ttype, offset)])
    if data is None:
        n = 1
        for d in dims:
            n *= d
        data = offset + (n // 32 * 34 if ttype == Q8_0_T else 4 * n)
    return refusal(padded(head, 32, data))


@pytest.mark.parametrize("rank", range(0, MAX_DIMS + 2))
def test_ranks_one_to_four(rank):
    msg = _one([1] * rank)
    assert msg is None if 1 <= rank <= MAX_DIMS else f"tensor t has {rank} dimensions (1 to 4)" in msg


def test_shapes():
    assert _one([4, 1]) is None
    assert "tensor t has shape [4, 0] (each dimension >= 1" in _one([4, 0])
    # the largest shape allowed gets past the shape check and is then refused for its data (not in the file)
    assert "tensor t's data (offset 0, 274877906944 bytes) lies outside" in _one([MAX_ELEMENTS], data=64)
    assert f"tensor t has shape [{MAX_ELEMENTS + 1}] (each dimension >= 1, at most {MAX_ELEMENTS} elements)" in _one(
        [MAX_ELEMENTS + 1], data=64)
    assert f"has shape [{1 << 18}, {(1 << 18) + 1}]" in _one([1 << 18, (1 << 18) + 1], data=64)  # the product counts


def test_quantized_rows_are_whole_blocks():
    assert _one([32, 3], Q8_0_T) is None
    assert "tensor t's rows of 48 are not whole Q8_0 blocks of 32" in _one([48, 3], Q8_0_T, data=200)


@pytest.mark.parametrize("ttype, match", [(99, "tensor t has unknown type 99; not a GGUF file"),
                                          (IQ2_XXS_T, "tensor t is IQ2_XXS; gptforge dequantizes F32, F16")])
def test_tensor_types_outside_what_is_read(ttype, match):
    assert match in _one([256], ttype, data=1024)


def test_a_tensor_named_twice():
    head = header([], [tensor("t", [1], F32_T, 0), tensor("t", [1], F32_T, 32)])
    assert "tensor t appears twice" in refusal(padded(head, 32, 36))
    head = header([], [tensor("t", [1], F32_T, 0), tensor("u", [1], F32_T, 32)])
    assert refusal(padded(head, 32, 36)) is None


def test_where_the_data_must_lie():
    """Offsets count from the aligned end of the header, are multiples of the alignment, and the last byte
    of each tensor's data is inside the file."""
    assert _one([8], offset=64) is None  # exactly to the file's end
    assert "tensor t's data (offset 64, 32 bytes) lies outside the" in _one([8], offset=64, data=64 + 31)
    assert "off its 32-byte alignment" in _one([8], offset=16, data=64)
    head = header([], [tensor("t", [8], F32_T, 0)])
    assert len(head) % 32  # so the data start is rounded up, not the header's end
    assert refusal(head + b"\0" * 32) is not None  # 32 bytes after the header, but fewer after the rounding
    # an offset is unsigned: 2**64 - 32 is aligned and far past the file (read signed it would be -32, the
    # 32 bytes before the data start, and pass both checks)
    assert f"tensor t's data (offset {2**64 - 32}, 32 bytes) lies outside" in _one([8], offset=2**64 - 32, data=64)


# --- what a refusal names (mutmut's survivors of the first run on this file) ------------------------------

@pytest.mark.parametrize("buf, what", [
    (b"GGU", "truncated at byte 0 reading the magic (4 bytes, file has 3)"),
    (header(n_kv=1)[:24] + struct.pack("<Q", 50) + b"ab" + b"\0" * 10,
     "truncated at byte 32 reading a metadata key (50 bytes, file has 44)"),
    (header(n_kv=1)[:24] + b"\0" * 5, "truncated at byte 24 reading a metadata key length (8 bytes, file has 29)"),
])
def test_a_truncation_names_what_was_being_read(buf, what):
    assert what in refusal(buf)


def test_lengths_and_the_version_are_unsigned():
    """A string length or a version with the top bit set is the huge number the file says, not a negative one."""
    buf = header(n_kv=1)[:24] + struct.pack("<Q", 2**64 - 1) + b"\0" * 40
    assert f"a metadata key is {2**64 - 1} bytes long (at most {MAX_KEY})" in refusal(buf)
    assert f"GGUF.version={2**32 - 1} (gptforge reads versions 2 and 3)" in refusal(header(version=2**32 - 1) + b"\0" * 8)


PARTS = [(b"GGUF", "the magic"), (struct.pack("<I", 3), "the version"), (struct.pack("<Q", 1), "the tensor count"),
         (struct.pack("<Q", 1), "the key count"), (struct.pack("<Q", 3), "a metadata key length"),
         (b"k.a", "a metadata key"), (struct.pack("<I", ARRAY), "k.a's type"),
         (struct.pack("<I", STRING), "k.a's item type"), (struct.pack("<Q", 1), "k.a's length"),
         (struct.pack("<Q", 2), None), (b"xy", "an item of k.a"), (struct.pack("<Q", 1), "a tensor name length"),
         (b"t", "a tensor name"), (struct.pack("<I", 1), "tensor t's rank"), (struct.pack("<Q", 8), "tensor t's shape"),
         (struct.pack("<I", F32_T), "tensor t's type"), (struct.pack("<Q", 0), "tensor t's offset")]


@pytest.mark.parametrize("i", [i for i, (_, what) in enumerate(PARTS) if what])
def test_a_file_cut_inside_any_field_names_that_field(i):
    """Each field of a whole header (one string array, one tensor), the file cut just before its last byte."""
    at = sum(len(p) for p, _ in PARTS[:i])
    part, what = PARTS[i]
    whole = b"".join(p for p, _ in PARTS)
    assert refusal(padded(whole, 32, 32)) is None
    cut = at + len(part) - 1  # the field's last byte missing
    assert f"truncated at byte {at} reading {what} ({len(part)} bytes, file has {cut})" in refusal(whole[:cut])


@pytest.mark.parametrize("i, match", [
    (2, f"GGUF.tensor_count={2**64 - 1} is absurd"), (3, f"GGUF.kv_count={2**64 - 1} is absurd"),
    (6, f"metadata key k.a has unknown type {2**32 - 1}"), (7, f"k.a is an array of type {2**32 - 1}"),
    (8, f"k.a claims {2**64 - 1} items"), (9, f"an item of k.a is {2**64 - 1} bytes long"),
    (13, f"tensor t has {2**32 - 1} dimensions"), (14, f"tensor t has shape [{2**64 - 1}]"),
    (15, f"tensor t has unknown type {2**32 - 1}")])
def test_every_count_and_type_is_unsigned(i, match):
    """A field with every bit set is the largest number its width holds, refused as such, never a negative one
    that slips under a bound."""
    parts = [p for p, _ in PARTS]
    parts[i] = b"\xff" * len(parts[i])
    assert match in refusal(padded(b"".join(parts), 32, 32))


def test_a_file_cut_inside_a_later_items_length_names_the_array():
    """A string array's count passes the bound (8 bytes a length) when an earlier item is long, so a file cut
    inside a later item's length is a truncation, named as an item of that array (mutmut: the name dropped)."""
    head = header([kv("k.a", ARRAY, struct.pack("<IQ", STRING, 2) + s("abcdefghij"))])
    cut = head + b"\2\0\0"  # 3 of the second item's 8 length bytes
    assert f"truncated at byte {len(head)} reading an item of k.a (8 bytes, file has {len(cut)})" in refusal(cut)


@pytest.mark.parametrize("extra", [0, 1])
def test_a_tensor_name_at_its_cap(extra):
    msg = _one([1], name="n" * (256 + extra))
    assert msg is None if not extra else "a tensor name is 257 bytes long (at most 256)" in msg
