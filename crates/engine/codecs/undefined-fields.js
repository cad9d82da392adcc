// A decoder that leaves fields `undefined` when the payload lacks them;
// The Things Stack shows them as null.

function decodeUplink(input) {
  var b = input.bytes;
  return {
    data: {
      temperature: b.length >= 2 ? ((b[0] << 8) | b[1]) / 10 : undefined,
      humidity: b.length >= 3 ? b[2] : undefined,
      nested: { gps: undefined, list: [undefined, 1] },
    },
  };
}
