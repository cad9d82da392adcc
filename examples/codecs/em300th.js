// Milesight EM300-TH uplink decoder (TTN / ChirpStack `decodeUplink` form).
//
// The payload is a sequence of records: channel id (1 byte), channel type
// (1 byte), then the value:
//   0x01 0x75  uint8              battery, %
//   0x03 0x67  int16 LE, /10      temperature, °C
//   0x04 0x68  uint8, /2          relative humidity, %
// Example: 01 75 5C 03 67 34 01 04 68 65 -> {battery:92, temperature:30.8, humidity:50.5}
function decodeUplink(input) {
  var bytes = input.bytes;
  var data = {};
  var i = 0;
  function need(n) {
    if (i + n > bytes.length) {
      throw new Error("truncated record at byte " + i);
    }
  }
  try {
    while (i < bytes.length) {
      need(2);
      var channel = bytes[i];
      var type = bytes[i + 1];
      i += 2;
      if (channel === 0x01 && type === 0x75) {
        need(1);
        data.battery = bytes[i];
        i += 1;
      } else if (channel === 0x03 && type === 0x67) {
        need(2);
        var raw = bytes[i] | (bytes[i + 1] << 8);
        if (raw > 0x7fff) raw -= 0x10000;
        data.temperature = raw / 10;
        i += 2;
      } else if (channel === 0x04 && type === 0x68) {
        need(1);
        data.humidity = bytes[i] / 2;
        i += 1;
      } else {
        return { errors: ["unknown record: channel 0x" + channel.toString(16) + " type 0x" + type.toString(16)] };
      }
    }
  } catch (e) {
    return { errors: [e.message] };
  }
  return { data: data };
}
