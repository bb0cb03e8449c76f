#!/usr/bin/python3
"""make_foreign_tfrecord.py - writes tests/data/foreign.tfrecord with code
that shares nothing with libemlio, so test_tfrecord can check that we read
shards written by someone else.

Framing and checksums: Debian's python3-crcmod (crcmod's predefined
'crc-32c', its own C extension), with TFRecord's masking as TensorFlow's
tensorflow/core/lib/hash/crc32c.h defines it.
Payloads: real tf.train.Example messages serialized by Debian's
python3-protobuf, from a descriptor of tensorflow/core/example/feature.proto
and example.proto built at run time (no TensorFlow, no protoc needed).

Usage: /usr/bin/python3 tests/data/make_foreign_tfrecord.py [out-path]
The output is deterministic; the committed file was made with
python3-crcmod 1.7+dfsg-3+b3 and python3-protobuf 3.21.12-3+deb12u1.
"""
import os
import struct
import sys

import crcmod.predefined
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def masked_crc(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc(header)) + data
            + struct.pack("<I", masked_crc(data)))


def example_classes():
    f = descriptor_pb2.FileDescriptorProto()
    f.name = "emlio_test_example.proto"
    f.package = "tensorflow"
    f.syntax = "proto3"  # as feature.proto: repeated scalars are packed
    LABEL_REP = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    LABEL_OPT = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    T = descriptor_pb2.FieldDescriptorProto

    def msg(name, fields, oneof=None):
        m = f.message_type.add()
        m.name = name
        if oneof:
            m.oneof_decl.add().name = oneof
        for num, fname, label, ftype, tname in fields:
            fd = m.field.add()
            fd.name, fd.number, fd.label, fd.type = fname, num, label, ftype
            if tname:
                fd.type_name = tname
            if oneof:
                fd.oneof_index = 0
        return m

    msg("BytesList", [(1, "value", LABEL_REP, T.TYPE_BYTES, None)])
    msg("FloatList", [(1, "value", LABEL_REP, T.TYPE_FLOAT, None)])
    msg("Int64List", [(1, "value", LABEL_REP, T.TYPE_INT64, None)])
    msg("Feature", [
        (1, "bytes_list", LABEL_OPT, T.TYPE_MESSAGE, ".tensorflow.BytesList"),
        (2, "float_list", LABEL_OPT, T.TYPE_MESSAGE, ".tensorflow.FloatList"),
        (3, "int64_list", LABEL_OPT, T.TYPE_MESSAGE, ".tensorflow.Int64List"),
    ], oneof="kind")
    feats = msg("Features", [
        (1, "feature", LABEL_REP, T.TYPE_MESSAGE,
         ".tensorflow.Features.FeatureEntry")])
    entry = feats.nested_type.add()
    entry.name = "FeatureEntry"
    entry.options.map_entry = True
    for num, fname, ftype, tname in ((1, "key", T.TYPE_STRING, None),
                                     (2, "value", T.TYPE_MESSAGE,
                                      ".tensorflow.Feature")):
        fd = entry.field.add()
        fd.name, fd.number, fd.label, fd.type = fname, num, LABEL_OPT, ftype
        if tname:
            fd.type_name = tname
    msg("Example", [(1, "features", LABEL_OPT, T.TYPE_MESSAGE,
                     ".tensorflow.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tensorflow.Example")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "foreign.tfrecord")
    Example = example_classes()
    records = []
    # Records 0-2: Examples in the ImageNet layout; payload bytes are a
    # simple pattern the C test recomputes (byte j of record i = (i*7+j)%251).
    for i in range(3):
        ex = Example()
        feat = ex.features.feature
        payload = bytes((i * 7 + j) % 251 for j in range(100 + 1000 * i))
        feat["image/encoded"].bytes_list.value.append(payload)
        feat["image/class/label"].int64_list.value.append(i - 1)  # -1, 0, 1
        feat["image/scores"].float_list.value.extend([0.5, 1.5, -2.0])
        records.append(ex.SerializeToString(deterministic=True))
    # Record 3: empty; record 4: 70000 bytes, past 65535 and not a multiple
    # of 8, so the length field and the CRC tails are exercised.
    records.append(b"")
    records.append(bytes((j * 13) & 0xFF for j in range(70000)))
    with open(out, "wb") as fh:
        for r in records:
            fh.write(frame(r))


if __name__ == "__main__":
    main()
