// page.js is served to browsers as text (imported with { type: "text" }).
declare const text: string;
export default text;
