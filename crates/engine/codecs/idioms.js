// Common JavaScript idioms of vendor codecs: destructuring and spread,
// arrow functions, template strings, Date, JSON, Math, Object.assign,
// typed arrays, hex strings and bit fields.

const BASE = { model: "demo", version: 2 };

function toHex(bytes) {
  return Array.from(bytes, (b) => ("0" + (b & 0xff).toString(16)).slice(-2)).join("");
}

function decodeUplink(input) {
  if (input.fPort === 5) {
    const u8 = Uint8Array.from(input.bytes);
    const i8 = new Int8Array(u8.buffer);
    const flags = u8[0];
    return {
      data: {
        hex: toHex(u8),
        signed: i8[1],
        alarm: !!(flags & 0x01),
        mode: (flags >> 1) & 0x03,
        id: ((u8[2] << 16) | (u8[3] << 8) | u8[4]) >>> 0,
        scaled: parseFloat((u8[1] * 0.1).toFixed(2)),
      },
    };
  }
  const [kind, ...rest] = input.bytes;
  const meta = JSON.parse('{"unit":"\u00b0C"}');
  const seconds = rest.reduce((acc, b) => acc * 256 + b, 0);
  const at = new Date(input.recvTime.getTime() - seconds * 1000);
  const data = Object.assign({}, BASE, {
    ...meta,
    kind: `k${kind}`,
    measuredAt: at.toISOString(),
    max: Math.max(...rest),
    hypot: Math.round(Math.hypot(3, 4)),
    pow: Math.pow(2, 10),
    sqrt: +Math.sqrt(2).toFixed(3),
    json: JSON.stringify({ a: [1, 2] }),
  });
  return { data };
}
