// A The Things Network v2 codec: `Decoder(bytes, port)` and
// `Encoder(object, port)`, as older device-repository entries still ship.

function Decoder(bytes, port) {
  var decoded = {};
  if (port === 1) {
    decoded.led = bytes[0] === 1 ? "on" : "off";
    decoded.temperature = ((bytes[1] << 8) | bytes[2]) / 10;
  }
  decoded.port = port;
  return decoded;
}

function Encoder(object, port) {
  var bytes = [];
  if (port === 2) {
    bytes.push(object.led === "on" ? 1 : 0);
  }
  return bytes;
}
