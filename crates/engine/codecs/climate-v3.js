// A climate sensor in the shape of The Things Stack's device repository:
// helpers at the top level, `decodeUplink` switching on the port, a
// DataView over the bytes, `normalizeUplink` beside it, errors and
// warnings returned rather than thrown.

function readUint16BE(bytes, offset) {
  return (bytes[offset] << 8) | bytes[offset + 1];
}

const round = (value, digits) => Number(value.toFixed(digits));

function decodeUplink(input) {
  const bytes = input.bytes;
  const data = {};
  const warnings = [];
  switch (input.fPort) {
    case 1: {
      if (bytes.length < 8) {
        return { errors: [`expected 8 bytes, got ${bytes.length}`] };
      }
      const view = new DataView(new Uint8Array(bytes).buffer);
      data.temperature = round(view.getInt16(0) / 100, 1);
      data.humidity = view.getUint8(2) / 2;
      data.pressure = view.getFloat32(3, false);
      data.battery = {
        voltage: round(((bytes[7] & 0x7f) * 20 + 2000) / 1000, 2),
        low: (bytes[7] & 0x80) !== 0,
      };
      break;
    }
    case 2:
      data.label = String.fromCharCode.apply(null, bytes);
      break;
    case 3:
      data.counter = ((bytes[0] << 24) >>> 0) + (bytes[1] << 16) + readUint16BE(bytes, 2);
      break;
    default:
      return { errors: [`unknown fPort ${input.fPort}`] };
  }
  if (data.battery && data.battery.low) {
    warnings.push("battery low");
  }
  return { data, warnings };
}

function normalizeUplink(input) {
  return { data: { air: { temperature: input.data.temperature } } };
}
