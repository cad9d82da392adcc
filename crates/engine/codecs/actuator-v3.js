// An actuator's downlink codec in The Things Stack's shape:
// `encodeDownlink` from `{data}`, `decodeDownlink` back for display, and
// a `decodeUplink` for its acknowledgements.

function decodeUplink(input) {
  return { data: { ack: input.bytes[0] === 1 } };
}

function encodeDownlink(input) {
  switch (input.data.command) {
    case "ring":
      return { bytes: [0x01, input.data.duration || 5], fPort: 10 };
    case "interval": {
      const m = input.data.minutes;
      return { bytes: [0x02, (m >> 8) & 0xff, m & 0xff], fPort: 11 };
    }
    default:
      return { errors: ["unknown command " + input.data.command] };
  }
}

function decodeDownlink(input) {
  switch (input.bytes[0]) {
    case 1:
      return { data: { command: "ring", duration: input.bytes[1] } };
    case 2:
      return { data: { command: "interval", minutes: (input.bytes[1] << 8) | input.bytes[2] } };
    default:
      return { errors: ["unknown downlink"] };
  }
}
